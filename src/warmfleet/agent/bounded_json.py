"""Untrusted JSON documents from the network (registry manifests, token answers), read with
bounds: the size while the body streams in (a body over the limit is refused before it is all
read, and never held whole), and the nesting depth before ``json.loads`` recurses into it (a
200,000-deep document would raise ``RecursionError``).

The depth check is ``core.jsonio.nests_deeper`` (on the raw bytes, before any parse), next to
the gateway's check of parsed bodies.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from warmfleet.agent.sources.base import SourceError
from warmfleet.core.jsonio import nests_deeper

MAX_JSON_DEPTH = 32  # OCI manifests and indexes nest 4-5 levels
READ_BLOCK_BYTES = 64 << 10


class DocumentTooLargeError(SourceError):
    """A document is larger than its configured limit; refused while it was being read."""


class DocumentTooDeepError(SourceError):
    """A JSON document nests deeper than ``MAX_JSON_DEPTH`` (or its brackets do not pair)."""


def check_json_depth(body: bytes, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    if nests_deeper(body, max_depth):
        raise DocumentTooDeepError(
            f"{what}: JSON nested deeper than {max_depth} levels (or unbalanced); refused"
        )


def loads_bounded(body: bytes, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` after the depth check; any parse failure is a SourceError."""
    check_json_depth(body, what, max_depth)
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as err:
        raise SourceError(f"{what}: not JSON: {err}") from err


async def read_bounded(resp: aiohttp.ClientResponse, limit_bytes: int, what: str) -> bytes:
    """The body of ``resp``, refused as soon as it is known to exceed ``limit_bytes``: from
    ``Content-Length`` before reading, else once the bytes read so far pass the limit (the
    connection is closed then: the rest is never read)."""
    declared = resp.content_length
    if declared is not None and declared > limit_bytes:
        resp.close()
        raise DocumentTooLargeError(
            f"{what}: {declared} bytes, larger than the limit of {limit_bytes} bytes"
        )
    buf = bytearray()
    async for block in resp.content.iter_chunked(READ_BLOCK_BYTES):
        if len(buf) + len(block) > limit_bytes:
            resp.close()
            raise DocumentTooLargeError(
                f"{what}: larger than the limit of {limit_bytes} bytes; refused while reading"
            )
        buf += block
    return bytes(buf)
