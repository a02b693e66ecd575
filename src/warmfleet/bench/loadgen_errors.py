"""Why a live run's requests failed, said where the user looks.

Each failed request has an error class (``http_404``, ``connection``, ``timeout``, ...) and a
message: the server's own (the OpenAI error envelope's ``message``) or the client's exception. The
summary keeps one sample message per class (``error_samples``); ``warmfleet bench`` prints the
classes with their counts and samples, and fails (exit 1) when more than ``--max-error-share`` of
the requests it sent failed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from warmfleet.core.failures import one_line

MAX_DETAIL_CHARS = 200
_BODY_PEEK_BYTES = 4096


def _clip(text: str) -> str:
    return one_line(text, MAX_DETAIL_CHARS)


def envelope_message(payload: Any) -> str | None:
    """The message of an OpenAI error envelope (``{"error": {"message": ...}}``), of a bare
    ``{"message": ...}`` / ``{"detail": ...}`` (FastAPI), or None."""
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    for key in ("message", "detail"):
        if isinstance(payload.get(key), str):
            return str(payload[key])
    return None


def http_error_detail(status: int, raw: bytes) -> str:
    """One short line for a non-200 answer: its error message, else the start of its body."""
    head = raw[:_BODY_PEEK_BYTES]
    try:
        message = envelope_message(json.loads(head)) if len(raw) <= _BODY_PEEK_BYTES else None
    except ValueError:
        message = None
    if message is None:
        message = head.decode("utf-8", "replace").strip() or "(empty body)"
    return _clip(f"HTTP {status}: {message}")


def exception_detail(err: BaseException) -> str:
    """One short line for a client-side failure (connection refused, reset, bad payload)."""
    text = str(err)
    return _clip(f"{type(err).__name__}: {text}" if text else type(err).__name__)


def failed_count(summary: Mapping[str, Any]) -> int:
    return int(sum(summary.get("errors", {}).values()))


def sent_count(summary: Mapping[str, Any]) -> int:
    requests = summary.get("requests", {})
    return int(requests.get("completed", 0)) + int(requests.get("rejected", 0))


def error_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per error class, most frequent first: count, share of the sent requests and a
    sample message."""
    sent = max(sent_count(summary), 1)
    samples = summary.get("error_samples", {})
    counts = sorted(summary.get("errors", {}).items(), key=lambda kv: (-kv[1], kv[0]))
    return [
        f"error {name}: {count} of {sent} requests ({100 * count / sent:.0f} %), "
        f"e.g. {samples.get(name) or '(no message)'}"
        for name, count in counts
    ]


def too_many_errors(summary: Mapping[str, Any], max_error_share: float) -> str | None:
    """The verdict line when more than ``max_error_share`` of the sent requests failed, else
    None. Nothing sent at all counts as a failure (the run measured nothing)."""
    failed, sent = failed_count(summary), sent_count(summary)
    if sent == 0:
        return "no request was sent (the --max-duration-s bound cut every one)"
    if failed / sent <= max_error_share:
        return None
    return (
        f"{failed} of {sent} requests failed ({100 * failed / sent:.1f} %), more than "
        f"--max-error-share {max_error_share:g}"
    )
