"""``warmfleet up`` as a real process: Ctrl-C (SIGINT) stops every process it started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.fleets import pid_alive, small_fleet

BOOT = "import sys; from warmfleet.cli import app; sys.argv[0] = 'warmfleet'; app()"


def _state(workdir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((workdir / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@pytest.mark.slow
def test_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    fleet = small_fleet(tmp_path / "w")
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    up = subprocess.Popen([sys.executable, "-c", BOOT, "up", str(path)], stdout=subprocess.DEVNULL)
    try:
        doc = None
        for _ in range(600):
            doc = _state(tmp_path / "w")
            if doc and any(r["state"] == "ready" for r in doc["replicas"]):
                break
            assert up.poll() is None, "warmfleet up exited early"
            time.sleep(0.1)
        assert doc is not None
        pids = [doc["originPid"]] + [n["agentPid"] for n in doc["nodes"]]
        pids += [r["pid"] for r in doc["replicas"]]
        assert len(pids) == 3
        assert all(pid_alive(int(p)) for p in pids)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
        assert not [p for p in pids if pid_alive(int(p))]
        final = _state(tmp_path / "w")
        assert final is not None
        assert final["running"] is False
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
