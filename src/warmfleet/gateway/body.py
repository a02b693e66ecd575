"""Parsing request bodies at the edge: strict JSON. (Size limit and slow senders are the HTTP
layer's, ``wire.py``.)"""

from __future__ import annotations

import json
from typing import Any

import orjson

from warmfleet.core.errors import BadRequestError


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict UTF-8 JSON whose top level is an object. orjson parses (and checks the UTF-8);
    what it refuses the standard library parses again, to accept what only orjson refuses or to
    name the precise error."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = _explain(raw)
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", param="body")
    return body


def _explain(raw: bytes) -> Any:
    """The value of a body only orjson refuses (integers beyond 64 bits, NaN, nesting deeper
    than 1,024 levels), else the precise error."""
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


def openai_fields(body: dict[str, Any]) -> tuple[str, bool]:
    """``model`` (non-empty string) and ``stream`` (boolean, default false)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequestError("'stream' must be a boolean", param="stream")
    return model, stream
