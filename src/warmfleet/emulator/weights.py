"""Load model weights for real before an emulated engine becomes ready (``--load-weights-from``).

Every byte is read: from a local directory (a node cache: every file under it) or from an HTTP
URL (the origin). The emulator's weights are not used for anything else; the point is that a
replica's time to ready includes an honest weights load, so warm (node cache) and cold (origin)
starts differ by what the I/O costs, not by an assumed figure.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from warmfleet.core.errors import WarmfleetError

READ_BLOCK_BYTES = 4 << 20


class WeightsLoadError(WarmfleetError):
    """The weights could not be read completely."""


@dataclass(frozen=True, slots=True)
class WeightsLoad:
    source: str
    bytes_read: int
    load_s: float


def _read_dir(root: Path) -> int:
    if not root.is_dir():
        raise WeightsLoadError(f"weights directory {root} does not exist")
    total = 0
    files = (p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    for path in sorted(files):  # dot-files are cache bookkeeping (markers), not weights
        with path.open("rb") as fh:
            while block := fh.read(READ_BLOCK_BYTES):
                total += len(block)
    return total


async def _read_url(url: str, timeout_s: float) -> int:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    total = 0
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
        if resp.status != 200:
            raise WeightsLoadError(f"GET {url}: HTTP {resp.status}")
        async for block in resp.content.iter_chunked(READ_BLOCK_BYTES):
            total += len(block)
        expected = resp.content_length
    if expected is not None and total != expected:
        raise WeightsLoadError(f"GET {url}: read {total} of {expected} bytes")
    return total


async def load_weights(source: str, timeout_s: float = 30.0) -> WeightsLoad:
    """Read every byte of ``source`` (a directory: every file but dot-files; or an http(s)
    URL); time it."""
    started = time.perf_counter()
    try:
        if source.startswith(("http://", "https://")):
            total = await _read_url(source, timeout_s)
        else:
            total = await asyncio.to_thread(_read_dir, Path(source))
    except (OSError, aiohttp.ClientError, TimeoutError) as err:
        raise WeightsLoadError(f"loading weights from {source}: {err}") from err
    return WeightsLoad(source, total, time.perf_counter() - started)
