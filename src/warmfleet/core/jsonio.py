"""Decoding JSON bodies fast and strictly (pure): orjson first, the standard library for what
only orjson refuses and for a precise error message.

Big bodies are parsed off the event loop (the gateway's body worker thread), but a thread only
helps while it runs bytecode: a C call holds the GIL until it returns. orjson parses a whole
body in one call, ~0.2-0.4 µs per value here (8 MB of tiny objects: 0.2-0.4 s in one call, the
event loop stopped all along). ``loads_body_yielding`` therefore lets orjson parse only bodies
that cannot hold more than ``FAST_PARSE_MAX_VALUES`` values; others go through the standard
library's pure-Python scanner (a C call per string only), 3-5 x slower, but the GIL changes hands
every switch interval.
"""

from __future__ import annotations

import json
import json.scanner
import re
from collections.abc import Callable
from typing import Any

import orjson

from warmfleet.core.errors import BadRequestError

# Values a body may hold for one orjson call to be short (~5 ms here) in loads_body_yielding.
FAST_PARSE_MAX_VALUES = 20_000
# Bytes a C call of ``value_bound`` counts in (~0.1-0.3 ms each here).
COUNT_STEP_BYTES = 256 << 10


def loads_body(raw: bytes) -> Any:
    """The JSON value of a UTF-8 request body, or ``BadRequestError`` naming what is wrong.

    orjson parses (and checks the UTF-8). What it refuses is parsed again by the standard
    library, which accepts integers beyond 64 bits, NaN and nesting deeper than 1,024 levels,
    and otherwise names the precise error."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _explain(raw)


def value_bound(raw: bytes) -> int:
    """An upper bound of the JSON values in ``raw``: every value but the first of a container
    follows a comma (commas inside strings only make the bound looser). Counted
    ``COUNT_STEP_BYTES`` at a time: one count over 7.5 MB held the GIL for 5-18 ms."""
    bound = 1
    for start in range(0, len(raw), COUNT_STEP_BYTES):
        end = start + COUNT_STEP_BYTES
        bound += raw.count(b",", start, end) + raw.count(b"{", start, end)
        bound += raw.count(b"[", start, end)
    return bound


def loads_body_yielding(raw: bytes) -> Any:
    """``loads_body``'s value and errors, without holding the GIL for long (module docstring):
    for a parse on a worker thread while the event loop serves."""
    if value_bound(raw) <= FAST_PARSE_MAX_VALUES:
        return loads_body(raw)
    text = _utf8(raw)
    return _decoded(lambda: _python_decoder().decode(text))


def loads_text_yielding(text: str) -> Any:
    """``json.loads(text)`` (its value and its ``ValueError``s), without holding the GIL for
    long when ``text`` may hold more than ``FAST_PARSE_MAX_VALUES`` values (a JSON string
    inside a body, such as a tool call's arguments)."""
    if value_bound(text.encode("utf-8", "surrogatepass")) <= FAST_PARSE_MAX_VALUES:
        return json.loads(text)
    return _python_decoder().decode(text)


def _python_decoder() -> json.JSONDecoder:
    """A decoder on the standard library's pure-Python scanner (a C call per string only); one
    per call: that scanner's memo is not thread-safe."""
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def _utf8(raw: bytes) -> str:
    if not raw:
        raise BadRequestError("request body is empty; expected a JSON object", param="body")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequestError(
            f"request body is not valid UTF-8 (byte {err.start})", param="body"
        ) from err


def _decoded(parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except json.JSONDecodeError as err:
        raise BadRequestError(
            f"request body is not valid JSON: {err.msg} at {err.pos}", param="body"
        ) from err
    except (ValueError, RecursionError) as err:
        raise BadRequestError(
            f"request body is not acceptable JSON: {type(err).__name__}", param="body"
        ) from err


def _explain(raw: bytes) -> Any:
    text = _utf8(raw)
    return _decoded(lambda: json.loads(text))


def deepest_field(body: dict[str, Any], max_depth: int) -> str | None:
    """The first top-level field of ``body`` under which containers nest more than
    ``max_depth`` deep (the body itself is level 1), else ``None``. Iterative, early exit."""
    for name, value in body.items():
        if (type(value) is dict or type(value) is list) and _deeper(value, max_depth - 1):
            return name
    return None


def _deeper(value: dict[str, Any] | list[Any], limit: int) -> bool:
    """Whether ``value`` (one level) holds containers more than ``limit`` levels deep."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if type(item) is dict else item:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


_STRING_RE = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKET_RE = re.compile(rb"[^\[\]{}]++")
_PAIR_RE = re.compile(rb"\[\]|\{\}")


def nests_deeper(raw: bytes, max_depth: int) -> bool:
    """Whether the JSON text ``raw`` nests deeper than ``max_depth`` levels (or its brackets do
    not pair), checked before parsing (a recursive parser meets the depth as ``RecursionError``).
    Exact and cheap: strings are cut out (their brackets do not count), everything but brackets
    is dropped, then each pass removes the innermost ``[]``/``{}`` pairs (one level per pass, in
    C); what is left after ``max_depth`` passes nests deeper. For a parsed body that must name
    the field, ``deepest_field``."""
    brackets = _NOT_BRACKET_RE.sub(b"", _STRING_RE.sub(b"", raw))
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets, removed = _PAIR_RE.subn(b"", brackets)
        if not removed:
            break
    return bool(brackets)
