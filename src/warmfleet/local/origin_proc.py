"""The model origin of the embedded fleet: synthetic weights files served over HTTP.

``python -m warmfleet.local.origin_proc --dir DIR --ready-file F [--throttle BPS]``
serves every file of DIR at ``/files/<name>`` (ranges, ETag, ``Repr-Digest``; one token bucket
over all connections, i.e. an origin with a fixed bandwidth, like a bucket behind a link) using
the agent's test origin. ``generate_model`` writes the synthetic weights.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
from pathlib import Path

from warmfleet.agent.testing.origin import Blob, Origin
from warmfleet.local.procs import serve_announced

BLOCK_BYTES = 1 << 20


def generate_model(path: Path, size_bytes: int, seed: str) -> None:
    """Deterministic pseudo-random bytes (distinct per model revision); kept if already there."""
    if path.exists() and path.stat().st_size == size_bytes:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    base = hashlib.shake_256(seed.encode()).digest(BLOCK_BYTES)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        written = 0
        index = 0
        while written < size_bytes:
            block = index.to_bytes(8, "little") + base[8:]
            block = block[: size_bytes - written]
            fh.write(block)
            written += len(block)
            index += 1
    tmp.replace(path)


async def serve(directory: Path, ready_file: Path, throttle_bps: float | None) -> None:
    origin = Origin(throttle_bps)
    for path in sorted(directory.iterdir()):
        if path.is_file() and not path.name.endswith(".tmp"):
            origin.put(path.name, await asyncio.to_thread(Blob, path=path))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = await serve_announced(origin.app(), ready_file)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--throttle", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(serve(args.dir, args.ready_file, args.throttle or None))


if __name__ == "__main__":
    main()
