"""Child processes of the embedded fleet: started with their output in a log file, watched
through a ready file they write, and stopped by PID (SIGTERM, then SIGKILL after a grace)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from warmfleet.core.errors import WarmfleetError

STOP_GRACE_S = 5.0
# the embedded agents' API token: the fleet makes one per run and gives it to each agent in this
# variable (their status.token_env), not the user's $WARMFLEET_AGENT_TOKEN
AGENT_TOKEN_ENV = "WARMFLEET_EMBEDDED_AGENT_TOKEN"
# only the emulator's command is imported (not the whole CLI): engine start-up stays short
EMULATE_BOOTSTRAP = (
    "import typer; from warmfleet.emulator.cli import emulate_command; typer.run(emulate_command)"
)


class FleetProcessError(WarmfleetError):
    """A child process of the embedded fleet exited or did not become ready."""


def module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def emulate_argv(*args: str) -> list[str]:
    """``warmfleet emulate <args>`` with this interpreter (no reliance on PATH)."""
    return [sys.executable, "-c", EMULATE_BOOTSTRAP, *args]


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    ready_file: Path
    log_path: Path
    started_wall_s: float
    ready_info: dict[str, Any] | None = field(default=None)
    ready_wall_s: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def poll_ready(self) -> bool:
        """True once the ready file exists (its mtime is the ready time)."""
        if self.ready_info is not None:
            return True
        try:
            stat = self.ready_file.stat()
            info = json.loads(self.ready_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        self.ready_info = info if isinstance(info, dict) else {}
        self.ready_wall_s = stat.st_mtime
        return True

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                await self.proc.wait()


async def start_child(
    name: str,
    argv: list[str],
    ready_file: Path,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
) -> Child:
    """``env``: the child's whole environment (default: this process's)."""
    ready_file.parent.mkdir(parents=True, exist_ok=True)
    ready_file.unlink(missing_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=env
        )
    return Child(name, proc, ready_file, log_path, time.time())


async def wait_ready(child: Child, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not child.poll_ready():
        if not child.alive:
            raise FleetProcessError(
                f"{child.name} exited ({child.proc.returncode}); see {child.log_path}"
            )
        if time.monotonic() > deadline:
            raise FleetProcessError(
                f"{child.name} not ready after {timeout_s} s; see {child.log_path}"
            )
        await asyncio.sleep(0.05)
    assert child.ready_info is not None
    return child.ready_info


async def stop_all(children: list[Child]) -> None:
    await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)


async def serve_announced(app: web.Application, ready_file: Path) -> web.AppRunner:
    """Serve ``app`` on a free loopback port, then atomically write ``{pid, url}`` to
    ``ready_file`` (the parent waits for it). The caller cleans the returned runner up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    tmp = ready_file.with_name(ready_file.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "url": f"http://127.0.0.1:{port}"}))
    tmp.replace(ready_file)
    return runner
