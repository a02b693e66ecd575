"""Child processes of live benchmarks: start, wait until ready, measure CPU, stop by PID.

Every child starts in its own session (so a terminal's Ctrl-C reaches only this process, which
then stops its children in order); ``ProcessSet`` stops each child it started, by PID, on every
exit path: SIGTERM, a grace period, then SIGKILL of the child's own process group.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TypeVar

import aiohttp

from warmfleet.core.errors import WarmfleetError
from warmfleet.edge import free_port as free_port  # noqa: PLC0414 (re-exported for the harnesses)

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcessError(WarmfleetError):
    """A child process failed to start or to become ready."""


class ChildExited(ProcessError):
    """A child exited while it was awaited (``wait_ready``)."""

    def __init__(self, child: Child) -> None:
        super().__init__(f"{child.name} exited early:\n{child.log_tail()}")
        self.child = child


_PORT_TAKEN_SIGNS = ("address already in use", "eaddrinuse", "os error 98")
START_ATTEMPTS = 3
_T = TypeVar("_T")


def port_taken(text: str) -> bool:
    """Whether ``text`` (a child's log, an error's message) says a port was already in use."""
    lowered = text.lower()
    return any(sign in lowered for sign in _PORT_TAKEN_SIGNS)


def command_argv(module: str, function: str, *args: str) -> list[str]:
    """argv running one typer command function of this interpreter's warmfleet (e.g. the
    ``warmfleet serve`` command as ``warmfleet.gateway.cli:serve_command``) without importing
    the whole CLI, so children start fast."""
    code = f"import typer; from {module} import {function} as f; typer.run(f)"
    return [sys.executable, "-c", code, *args]


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to the child, wait ``grace_s``, then SIGKILL to its process group."""
        if self.popen.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_s)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # its own group (start_new_session): stragglers
        with suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)


@dataclass
class ProcessSet:
    """Children started by one benchmark; ``stop_all`` stops them in reverse start order."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        full_env = {**os.environ, **(env or {})}
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )
        child = Child(name, popen, log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        while self.children:
            self.children.pop().stop()


@contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``SystemExit`` so ``finally`` blocks stop the children."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


async def wait_ready(
    url: str,
    child: Child | None = None,
    timeout_s: float = 60.0,
    accept: Sequence[int] = (200,),
) -> None:
    """Poll ``url`` until it answers one of ``accept``; fail early if ``child`` exits."""
    deadline = time.monotonic() + timeout_s
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if child is not None and not child.alive():
                raise ChildExited(child)
            try:
                async with session.get(url) as resp:
                    await resp.read()
                    if resp.status in accept:
                        return
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(0.1)
    tail = child.log_tail() if child is not None else ""
    raise ProcessError(f"{url} not ready after {timeout_s:.0f} s\n{tail}")


def _children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read_stat(int(entry))
        if stat is not None:
            tree.setdefault(int(stat[1]), []).append(int(entry))
    return tree


def _read_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (Linux /proc)."""
    tree = _children_of()
    total_ticks = 0
    stack = [pid]
    while stack:
        current = stack.pop()
        stat = _read_stat(current)
        if stat is not None:
            total_ticks += int(stat[11]) + int(stat[12])  # utime, stime
        stack.extend(tree.get(current, ()))
    return total_ticks / _CLK_TCK


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of all CPUs since boot (/proc/stat; total = wall x CPUs)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / _CLK_TCK, sum(fields) / _CLK_TCK


async def retry_if_port_taken(
    procs: ProcessSet, launch: Callable[[], Awaitable[_T]], attempts: int = START_ATTEMPTS
) -> _T:
    """``launch()`` (start a child on ports picked with ``free_port`` and wait for it), again
    while the child exits because one of its ports was taken. A port is only known free when
    picked: another process can take it before the child binds it (``free_port`` picks below
    the ephemeral range, so a loopback connection's source port no longer can)."""
    for attempt in range(attempts):
        try:
            return await launch()
        except ChildExited as err:
            procs.stop(err.child)
            if attempt + 1 < attempts and port_taken(err.child.log_tail(200)):
                continue
            raise
    raise ProcessError(f"no start in {attempts} attempts")  # only when attempts < 1
