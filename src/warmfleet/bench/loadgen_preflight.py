"""Before any load: every ``--url`` is an http(s) base URL that answers, and the model to send.

``warmfleet bench`` checks its URLs before it sends a single request: a URL without a scheme or a
closed port is one line and exit 2, not a run of failed requests (a ``--metrics-url`` that is not
an http(s) URL too). Without ``--model`` the model
is the one the servers list on ``GET /v1/models`` (vLLM, the emulator and the gateway serve it);
when they list none, several, or cannot list, the user must name it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from warmfleet.bench.loadgen_metrics import MetricsTarget
from warmfleet.core.errors import WarmfleetError
from warmfleet.core.failures import one_line

PREFLIGHT_TIMEOUT_S = 10.0
MAX_MODELS_BYTES = 4 * 1024 * 1024  # a /v1/models answer with hundreds of LoRA adapters: ~100 KB
SHOWN_MODELS = 5


class PreflightError(WarmfleetError):
    """A URL is malformed or does not answer, or the model cannot be chosen; one line."""


def check_base_url(url: str) -> str:
    """``url`` without a trailing slash; ``PreflightError`` unless it is ``http(s)://host[:port]``
    (a path prefix is allowed: a router serving under one)."""
    base = url.rstrip("/")
    try:
        split = urlsplit(base)
        port_ok = split.port is None or split.port > 0
    except ValueError as err:
        raise PreflightError(f"--url {url}: {err}") from err
    if split.scheme not in ("http", "https") or not split.hostname or not port_ok:
        raise PreflightError(f"--url {url}: not an http(s) URL; give e.g. http://127.0.0.1:8080")
    if split.query or split.fragment:
        raise PreflightError(f"--url {url}: a base URL has no query or fragment")
    return base


def metrics_target(text: str) -> MetricsTarget:
    """``--metrics-url ID=URL`` (a bare URL is its own id); ``PreflightError`` unless the URL is
    ``http(s)://host[:port]/...``: checked before any load, not skipped after it."""
    target = MetricsTarget.parse(text)
    try:
        split = urlsplit(target.url)
        port_ok = split.port is None or split.port > 0
    except ValueError as err:
        raise PreflightError(f"--metrics-url {text}: {err}") from err
    if split.scheme not in ("http", "https") or not split.hostname or not port_ok:
        raise PreflightError(
            f"--metrics-url {text}: not an http(s) URL; give e.g. "
            "engine-0=http://127.0.0.1:8000/metrics"
        )
    if not target.instance:
        raise PreflightError(f"--metrics-url {text}: an empty id before '='")
    return target


def model_ids(payload: Any) -> list[str] | None:
    """The ids of an OpenAI ``GET /v1/models`` answer, or None when it is not one."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        return None
    ids = [m.get("id") for m in payload["data"] if isinstance(m, dict)]
    return [i for i in ids if isinstance(i, str)]


async def _listed(session: aiohttp.ClientSession, url: str) -> tuple[str, list[str] | str]:
    """``(url, model ids)``, or ``(url, why they are unknown)`` for a server that answers but
    lists no models; ``PreflightError`` for one that does not answer."""
    try:
        async with session.get(url + "/v1/models") as resp:
            raw = await resp.content.read(MAX_MODELS_BYTES + 1)
            if resp.status != 200:
                return url, f"GET {url}/v1/models answered HTTP {resp.status}"
    except TimeoutError as err:
        raise PreflightError(
            f"cannot reach {url}: no answer within {PREFLIGHT_TIMEOUT_S:g} s"
        ) from err
    except (aiohttp.ClientError, OSError) as err:
        reason = one_line(str(err)) or type(err).__name__
        raise PreflightError(f"cannot reach {url}: {reason}") from err
    try:
        ids = model_ids(orjson.loads(raw)) if len(raw) <= MAX_MODELS_BYTES else None
    except orjson.JSONDecodeError:
        ids = None
    return url, ids if ids is not None else f"GET {url}/v1/models is not a model list"


def choose_model(listed: Sequence[tuple[str, list[str] | str]]) -> str:
    """The one model every URL lists; ``PreflightError`` asking for ``--model`` otherwise."""
    lists: list[list[str]] = []
    for _url, ids in listed:
        if isinstance(ids, str):
            raise PreflightError(f"{ids}: pass --model")
        lists.append(list(dict.fromkeys(ids)))
    common = [i for i in lists[0] if all(i in other for other in lists[1:])] if lists else []
    if len(common) == 1:
        return common[0]
    shown = ", ".join(common[:SHOWN_MODELS]) + (", ..." if len(common) > SHOWN_MODELS else "")
    count = f"{len(common)} models ({shown})" if common else "no model"
    where = f"{listed[0][0]} serves" if len(listed) == 1 else "the URLs serve"
    in_common = " in common" if len(listed) > 1 else ""
    raise PreflightError(f"{where} {count}{in_common}: pass --model")


async def preflight(urls: Sequence[str], model: str | None) -> str:
    """Every URL answers (``GET /v1/models``, any status); the model to send: ``model``, else
    the one every URL lists."""
    timeout = aiohttp.ClientTimeout(total=PREFLIGHT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        listed = await asyncio.gather(*(_listed(session, url) for url in urls))
    return model if model is not None else choose_model(listed)
