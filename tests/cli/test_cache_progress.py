"""Issue 21, "progress and logs on long work", for the node cache: ``cache prefetch`` of a local
path shows the same byte progress as a download (its copy, hashed as it goes: no separate
sha256 step since issue 24), on a terminal and piped; ``cache agent`` logs what it fetches and
serves, at the ``--log-level`` asked for."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from cli_support import WARMFLEET, run_cli
from pty_support import ANSI_ESCAPE, run_in_pty, run_piped

pytestmark = pytest.mark.e2e

SIZE_BYTES = 48_000_000


def _model_dir(tmp_path: Path) -> Path:
    src = tmp_path / "model"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(SIZE_BYTES))
    (src / "config.json").write_text("{}")
    return src


@pytest.mark.slow
def test_local_prefetch_shows_copy_progress_on_a_terminal(tmp_path: Path) -> None:
    src = _model_dir(tmp_path)
    out = run_in_pty("cache", "prefetch", str(src), "--dest", str(tmp_path / "cache"))
    assert out.returncode == 0, out.text
    running = ANSI_ESCAPE.sub("", out.text_while_running())
    assert "hashing" not in running, running  # resolve only stats; the copy hashes
    # the state column: ``copying`` while a poll (every 0.2 s) lands during the copy; a quiet
    # machine may copy 48 MB between two polls, so the row may go from nothing to ``ready``
    assert re.search(r"MB .*(copying|verifying|ready)", running), running
    assert "48.0/48.0 MB" in running, running  # rich's byte column
    assert "\u2501" in running  # a bar
    assert "ready model" in ANSI_ESCAPE.sub("", out.text)


@pytest.mark.slow
def test_local_prefetch_piped_logs_plain_lines(tmp_path: Path) -> None:
    src = _model_dir(tmp_path)
    done = run_piped("cache", "prefetch", str(src), "--dest", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    *progress, ready = done.stdout.strip().splitlines()
    lines = [line.split(" ", 1)[1] for line in progress]
    assert lines[0] == "model: started (48.0 MB)"
    assert lines[-1].startswith("model: done, 48.0 MB in ")
    assert lines[-1].endswith(", ready")
    assert len(lines) <= 2 + 10
    assert ready.startswith("ready model ")


def _read_until(proc: subprocess.Popen[bytes], wanted: str, deadline_s: float) -> str:
    assert proc.stderr is not None
    text = ""
    end_s = time.monotonic() + deadline_s
    while wanted not in text and time.monotonic() < end_s:
        ready, _, _ = select.select([proc.stderr.fileno()], [], [], 0.2)
        if ready:
            data = os.read(proc.stderr.fileno(), 65536)
            assert data, f"cache agent ended:\n{text}"
            text += data.decode("utf-8", "replace")
    assert wanted in text, text
    return text


def _node_file(tmp_path: Path, src: Path) -> Path:
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "NodeCacheConfig",
        "spec": {
            "root": str(tmp_path / "cache"),
            "capacity": {"budget": "256MiB", "reserve": "0"},
            "status": {"host": "127.0.0.1", "port": 0},
            "reconcileIntervalS": 0.2,
            "artifacts": [{"type": "model", "name": "w", "uri": str(src)}],
        },
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
def test_cache_agent_logs_what_it_fetches_and_serves(tmp_path: Path) -> None:
    node = _node_file(tmp_path, _model_dir(tmp_path))
    argv = [WARMFLEET, "cache", "agent", "--config", str(node), "--log-level", "info"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        text = _read_until(proc, "fetched w (", 60.0)
        assert "fetching w (" in text
        assert f"from file://{tmp_path}/model: 48.0 MB in 2 files" in text
        assert "serving it from " in text
        port = json.loads((tmp_path / "cache" / "agent.json").read_text())["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=5) as resp:
            assert resp.status == 200
        text += _read_until(proc, "served GET /v1/status -> 200", 10.0)
        assert "INFO warmfleet.agent" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize(
    "command", [["cache", "agent", "--config", "node.yaml"], ["serve", "-c", "g.yaml"], ["emulate"]]
)
def test_an_unknown_log_level_is_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    done = run_cli(*command, "--log-level", "loud", cwd=tmp_path)
    assert done.returncode == 2  # a usage error, as click reports them, before any work
    said = " ".join(done.stderr.replace("│", " ").split())  # the usage box wraps lines
    assert "Invalid value for '--log-level'" in said
    assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in said
    assert "Traceback" not in done.stderr
