"""Reading and parsing request bodies at the edge: size limit, slow senders, strict JSON."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from warmfleet.core.errors import BadRequestError, RequestTooLargeError
from warmfleet.gateway.config import LimitsConfig
from warmfleet.gateway.errors import RequestTimeoutError


async def read_body(request: web.Request, limits: LimitsConfig) -> bytes:
    """The whole body, at most ``max_body_bytes``, sent within ``body_read_timeout_s``."""
    max_bytes = limits.max_body_bytes
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise RequestTooLargeError(
            f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes"
        )
    content = request.content
    if declared is not None and content.is_eof():
        # Fast path: the whole body arrived with the headers; no timer needed.
        raw = content.read_nowait(-1)
        if len(raw) != declared:
            raise BadRequestError("request body shorter than its Content-Length", param="body")
        return raw
    try:
        async with asyncio.timeout(limits.body_read_timeout_s):
            if declared is not None:
                # The common case: one read of exactly the declared length.
                return await content.readexactly(declared)
            chunks: list[bytes] = []
            size = 0
            while chunk := await content.readany():
                size += len(chunk)
                if size > max_bytes:
                    raise RequestTooLargeError(
                        f"request body exceeds the limit of {max_bytes} bytes"
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError as err:
        raise RequestTimeoutError(
            f"request body not received within {limits.body_read_timeout_s} s"
        ) from err
    except asyncio.IncompleteReadError as err:
        raise BadRequestError("request body shorter than its Content-Length", param="body") from err


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Strict UTF-8 JSON whose top level is an object."""
    if not raw:
        raise BadRequestError("request body is empty; expected a JSON object", param="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequestError(
            f"request body is not valid UTF-8 (byte {err.start})", param="body"
        ) from err
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequestError(
            f"request body is not valid JSON: {err.msg} at {err.pos}", param="body"
        ) from err
    except (ValueError, RecursionError) as err:
        raise BadRequestError(
            f"request body is not acceptable JSON: {type(err).__name__}", param="body"
        ) from err
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
