"""Decoding JSON bodies fast and strictly (pure): orjson first, the standard library for what
only orjson refuses and for a precise error message."""

from __future__ import annotations

import json
from typing import Any

import orjson

from warmfleet.core.errors import BadRequestError


def loads_body(raw: bytes) -> Any:
    """The JSON value of a UTF-8 request body, or ``BadRequestError`` naming what is wrong.

    orjson parses (and checks the UTF-8). What it refuses is parsed again by the standard
    library, which accepts integers beyond 64 bits, NaN and nesting deeper than 1,024 levels,
    and otherwise names the precise error."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _explain(raw)


def _explain(raw: bytes) -> Any:
    if not raw:
        raise BadRequestError("request body is empty; expected a JSON object", param="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequestError(
            f"request body is not valid UTF-8 (byte {err.start})", param="body"
        ) from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequestError(
            f"request body is not valid JSON: {err.msg} at {err.pos}", param="body"
        ) from err
    except (ValueError, RecursionError) as err:
        raise BadRequestError(
            f"request body is not acceptable JSON: {type(err).__name__}", param="body"
        ) from err
