"""Parsing request bodies at the edge: strict JSON. (Size limit and slow senders are the HTTP
layer's, ``wire.py``.)"""

from __future__ import annotations

from typing import Any

from warmfleet.core.errors import BadRequestError
from warmfleet.core.jsonio import loads_body


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict UTF-8 JSON whose top level is an object (see ``loads_body``)."""
    body = loads_body(raw)
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", param="body")
    return body


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
