"""Issue 21, "progress and logs on long work": ``warmfleet up`` says what happens as it happens.
Piped, its stdout has plain lines for the cache filling on the node (with its percentage), the
node ready, the replica started and ready and the gateway switched to it, while the fleet keeps
running."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_support import WARMFLEET
from pty_support import ANSI_ESCAPE

from support.fleets import small_fleet

pytestmark = pytest.mark.e2e

MODEL_BYTES = 24_000_000  # filled at 8 MB/s: several progress reports of the fill


def _read_until(proc: subprocess.Popen[bytes], wanted: list[str], deadline_s: float) -> str:
    """stdout as it comes, until every ``wanted`` text was seen (or the deadline)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    text = ""
    end_s = time.monotonic() + deadline_s
    while time.monotonic() < end_s and not all(w in text for w in wanted):
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            data = os.read(fd, 65536)
            assert data, f"warmfleet up ended early:\n{text}"
            text += data.decode("utf-8", "replace")
    return text


@pytest.mark.slow
def test_up_logs_the_cache_fill_and_the_replica_ready(tmp_path: Path) -> None:
    doc = small_fleet(tmp_path / "w")
    doc["spec"]["origin"]["throttle"] = "8MB"
    doc["spec"]["origin"]["models"][0]["size"] = MODEL_BYTES
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    argv = [WARMFLEET, "up", str(path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        wanted = ["filling on n1: done, 24.0 MB", "gateway switched: m/main", "-1 ready on n1"]
        text = _read_until(proc, wanted, 90.0)
        assert proc.poll() is None, text  # told while it runs, not at the end
        said = text.splitlines()
        lines = [line for line in said if not line.startswith("warmfleet up: gateway ")]
        assert len(lines) == len(said) - 1, text  # and the gateway's URL, once
        assert all(w in text for w in wanted), text
        fill = [line for line in lines if "cache m-" in line and "filling on n1" in line]
        assert any(line.endswith("started (24.0 MB)") for line in fill), text
        assert any(" %), " in line and "MB/s" in line for line in fill), text
        assert any("node n1 ready: weights.warmfleet.dev/m-" in line for line in lines), text
        started = next(i for i, line in enumerate(lines) if "started on n1" in line)
        ready = [i for i, line in enumerate(lines) if "replica m-main-" in line]
        assert any(lines[i].endswith(" ready on n1") and started < i for i in ready), text
        assert ANSI_ESCAPE.search(text) is None, text
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d [^ ].+", line) for line in lines), text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _up(path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [WARMFLEET, "up", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.slow
def test_a_second_up_in_the_same_workdir_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    """Two fleets in one workdir shared node roots, ready files and state.json."""
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(small_fleet(tmp_path / "w")))
    first = _up(path)
    try:
        _read_until(first, ["warmfleet up: gateway "], 90.0)
        run = tmp_path / "w" / "run"
        deadline = time.monotonic() + 60
        while not all((run / f).exists() for f in ("origin.json", "agent-n1.json")):
            assert time.monotonic() < deadline, sorted(p.name for p in run.iterdir())
            time.sleep(0.1)
        files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
        second = subprocess.run(
            [WARMFLEET, "up", str(path)], capture_output=True, text=True, timeout=60, check=False
        )
        assert second.returncode == 2, second.stderr
        assert "another `warmfleet up` is running in" in second.stderr
        assert second.stderr.count("\n") == 1
        for name, data in files.items():  # the first fleet's files (it may add more)
            assert (run / name).read_bytes() == data, name
        assert first.poll() is None
    finally:
        assert _stop(first) == 0


@pytest.mark.slow
def test_a_signal_while_the_origin_writes_a_model_stops_up_at_once(tmp_path: Path) -> None:
    """The model was written on the event loop: the signal waited for it, then for the whole
    fleet to start."""
    doc = small_fleet(tmp_path / "w")
    doc["spec"]["origin"]["models"][0]["size"] = 4 << 30
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = _up(path)
    partial = tmp_path / "w" / "origin"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(partial.glob("*.tmp")):
        time.sleep(0.05)
    assert _stop(proc, signal.SIGTERM) == 0
    written = sum(p.stat().st_size for p in partial.glob("*.tmp"))
    assert written < 4 << 30
    assert not (tmp_path / "w" / "run" / "origin.json").exists()  # nothing started after
