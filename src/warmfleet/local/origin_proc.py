"""The model origin of the embedded fleet as a child process: synthetic weights files over HTTP.

``python -m warmfleet.local.origin_proc --dir DIR --ready-file F [--throttle BPS]``
serves every file of DIR at ``/files/<name>`` (ranges, ETag, ``Repr-Digest``; one token bucket
over all connections, i.e. an origin with a fixed bandwidth, like a bucket behind a link) with
``warmfleet.local.origin``. ``generate_model`` writes the synthetic weights.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from warmfleet.local.origin import Blob, Origin
from warmfleet.local.procs import serve_announced

BLOCK_BYTES = 1 << 20


def generate_model(
    path: Path, size_bytes: int, seed: str, cancel: threading.Event | None = None
) -> None:
    """Deterministic pseudo-random bytes (distinct per model revision); kept if already there.
    ``cancel`` set: stop between blocks (``InterruptedError``; the ``.tmp`` file is rewritten
    next time)."""
    if path.exists() and path.stat().st_size == size_bytes:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    base = hashlib.shake_256(seed.encode()).digest(BLOCK_BYTES)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        written = 0
        index = 0
        while written < size_bytes:
            if cancel is not None and cancel.is_set():
                raise InterruptedError(f"generating {path} was cancelled")
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


def origin_command(
    directory: Annotated[Path, typer.Option("--dir", help="serve every file of DIR")],
    ready_file: Annotated[Path, typer.Option(help="written with {pid, url} once serving")],
    throttle: Annotated[float, typer.Option(help="bandwidth in bytes/s (0: unlimited)")] = 0.0,
) -> None:
    """Serve DIR's files at /files/<name> until SIGINT or SIGTERM."""
    if not directory.is_dir():
        print(f"origin: no such directory: {directory}", file=sys.stderr)
        raise typer.Exit(2)
    asyncio.run(serve(directory, ready_file, throttle or None))


def main() -> None:
    typer.run(origin_command)


if __name__ == "__main__":
    main()
