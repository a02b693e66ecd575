"""Gateways outside the test's event loop: ``ThreadedGateway`` (fake backends, and a gateway
unless told not to, served by an event loop in a background thread, for synchronous clients and
subprocess gateways) and ``GatewayProcess`` (``warmfleet serve --config PATH``, or ``python -m
warmfleet.gateway``, in a subprocess stopped by PID)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway_support import FakeBackend, backends_running, gateway_running

from warmfleet.gateway.config import parse_gateway_config


class ThreadedGateway:
    """Backends (+ a gateway unless ``make_doc`` is None) served by an event loop in a
    background thread, for synchronous clients and subprocess gateways."""

    def __init__(
        self,
        make_doc: Callable[[Sequence[FakeBackend]], dict[str, Any]] | None,
        names: Sequence[str],
    ) -> None:
        self._make_doc = make_doc
        self._names = names
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""
        self.backends: list[FakeBackend] = []
        self.error: BaseException | None = None

    def __enter__(self) -> ThreadedGateway:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("gateway thread did not start")
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # surfaced to the test
            self.error = err
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with backends_running(*self._names) as backends:
            self.backends = backends
            if self._make_doc is None:
                self._ready.set()
                await self._stop.wait()
                return
            config = parse_gateway_config(self._make_doc(backends))
            async with gateway_running(config) as gw:
                self.url = gw.url
                self._ready.set()
                await self._stop.wait()


class GatewayProcess:
    """``warmfleet serve --config PATH`` in a subprocess (stopped by PID on exit)."""

    def __init__(
        self, config_path: Path, *, module: bool = False, command: list[str] | None = None
    ) -> None:
        self.config_path = config_path
        self.module = module  # `python -m warmfleet.gateway` (faster start) vs `warmfleet serve`
        self.command = command  # instead of either: a program taking --config and --log-level
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.stderr_path = config_path.with_suffix(".stderr")

    def __enter__(self) -> GatewayProcess:
        if self.command is not None:
            command = self.command
        elif self.module:
            command = [sys.executable, "-m", "warmfleet.gateway"]
        else:
            command = [str(Path(sys.executable).parent / "warmfleet"), "serve"]
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [*command, "--config", str(self.config_path), "--log-level", "warning"],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "warmfleet gateway listening on http://..."
        if "listening on" not in line:
            self.__exit__()
            raise RuntimeError(f"gateway did not start: {line!r} {self.stderr()}")
        self.url = line.strip().rsplit(" ", 1)[-1]
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
