"""Running ``warmfleet`` as a user does (the installed script, in a subprocess) and checking that
a failure is loud and short: its exit status, at most 3 lines on stderr, no traceback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from warmfleet.edge import free_port

WARMFLEET = str(Path(sys.executable).parent / "warmfleet")
MAX_STDERR_LINES = 3
MODEL = "test/tiny-model"


def run_cli(
    *args: str, timeout_s: float = 120.0, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``warmfleet ARGS`` to completion (stdin closed)."""
    return subprocess.run(
        [WARMFLEET, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def assert_short_failure(done: subprocess.CompletedProcess[str], exit_status: int) -> str:
    """The command failed with ``exit_status``, saying why in 1 to 3 lines of stderr and no
    traceback; returns stderr."""
    detail = f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == exit_status, detail
    lines = done.stderr.strip().splitlines()
    assert 1 <= len(lines) <= MAX_STDERR_LINES, detail
    assert "Traceback" not in done.stderr, detail
    return done.stderr


@contextmanager
def busy_port() -> Iterator[int]:
    """A port of 127.0.0.1 that a listening socket holds for the duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@contextmanager
def busy_port_above(floor: int) -> Iterator[int]:
    """A port of 127.0.0.1 above ``floor`` that a listening socket holds for the duration (the
    first free one; ``busy_port`` may get any port, even one below ``floor``)."""
    with socket.socket() as sock:
        for port in range(floor + 1, 65536):
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            sock.listen()
            yield port
            return
    raise OSError(f"no free port of 127.0.0.1 above {floor}")


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on, below the kernel's ephemeral range
    (``edge.free_port``): a connection to a released port-0 pick can take that very port as
    its source and connect to itself (TCP's simultaneous open), and then it is not refused."""
    return free_port()


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM by PID, then SIGKILL if it does not exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@contextmanager
def emulator(model: str = MODEL) -> Iterator[str]:
    """``warmfleet emulate``: one tiny instance serving ``model`` on a free port; its URL."""
    argv = [WARMFLEET, "emulate", "-n", "1", "--base-port", "0", "--preset", "tiny-cpu"]
    argv += ["--model", model, "--time-scale", "50"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"emulate did not start: {proc.stderr.read() if proc.stderr else ''}"
        yield str(json.loads(line)["urls"][0])
    finally:
        stop(proc)


def gateway_file(path: Path, instance_urls: list[str], port: int = 0) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "listen": {"host": "127.0.0.1", "port": port},
            "endpoints": [
                {
                    "name": "chat",
                    "variants": [
                        {
                            "name": "main",
                            "routing": {"strategy": {"type": "prefix_affinity"}},
                            "instances": [
                                {"id": f"e{i}", "url": url} for i, url in enumerate(instance_urls)
                            ],
                        }
                    ],
                }
            ],
        },
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@contextmanager
def gateway(config: Path) -> Iterator[str]:
    """``warmfleet serve --config CONFIG`` until the block ends; its URL."""
    argv = [WARMFLEET, "serve", "--config", str(config), "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, f"{line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield line.strip().rsplit(" ", 1)[-1]
    finally:
        stop(proc)
