"""The supervisor of one real engine replica of the embedded fleet (``engine.type: vllm``).

``python -m warmfleet.local.engine_proc --ready-file F --model-dir D -- CMD...``

The fleet watches every child through a ready file and stops it by PID (``local.procs``); a
real server writes no ready file and spawns processes of its own. This supervisor gives it both:
it picks a free loopback port, starts ``CMD`` (every ``{port}`` in it replaced by that port) as
the leader of its own process group, polls ``GET /health`` until it answers 200, then writes
``{"pid", "urls", "weights"}`` (the model directory's bytes and the seconds to healthy) to the
ready file. On SIGTERM or SIGINT it stops the whole group (SIGTERM, then SIGKILL after
``--grace-s``) and exits; when the server exits on its own, the supervisor exits with its code.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated

import typer

from warmfleet.edge import free_port

POLL_S = 0.5
HEALTH_TIMEOUT_S = 2.0


def directory_bytes(path: Path) -> int:
    """The bytes of every regular file under ``path`` (what the engine loads from)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=HEALTH_TIMEOUT_S) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def write_ready(ready_file: Path, url: str, bytes_read: int, load_s: float) -> None:
    info = {
        "pid": os.getpid(),
        "urls": [url],
        "weights": {"bytes_read": bytes_read, "load_s": round(load_s, 3)},
    }
    tmp = ready_file.with_name(ready_file.name + ".tmp")
    tmp.write_text(json.dumps(info), encoding="utf-8")
    tmp.replace(ready_file)


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM the server's process group, SIGKILL it after ``grace_s``; its exit code."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def supervise(argv: list[str], ready_file: Path, model_dir: Path, grace_s: float) -> int:
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [arg.replace("{port}", str(port)) for arg in argv]
    started_s = time.monotonic()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    ready = False
    while not stopping:
        code = proc.poll()
        if code is not None:
            print(f"engine exited ({code}) before it was stopped", file=sys.stderr)
            return code or 1
        if not ready and healthy(url):
            ready = True
            write_ready(ready_file, url, directory_bytes(model_dir), time.monotonic() - started_s)
        time.sleep(POLL_S)
    stop_group(proc, grace_s)
    return 0


def engine_command(
    ready_file: Annotated[Path, typer.Option(help="{pid, urls, weights}, once healthy")],
    model_dir: Annotated[Path, typer.Option(help="the model directory the engine loads")],
    command: Annotated[list[str], typer.Argument(help="the server command; {port} is replaced")],
    grace_s: Annotated[float, typer.Option(help="SIGTERM to SIGKILL of the server's group")] = 3.0,
) -> None:
    """Run one engine server until SIGTERM; write the ready file once it is healthy."""
    raise typer.Exit(supervise(command, ready_file, model_dir, grace_s))


def main() -> None:
    typer.run(engine_command)


if __name__ == "__main__":
    main()
