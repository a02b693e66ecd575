"""``warmfleet fleet whatif --params`` takes a mapping of parameters and nothing else, checks them
together and shows its progress; ``warmfleet status`` checks the shape of the state it draws."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_support import busy_port
from typer.testing import CliRunner, Result

from warmfleet.cli import app
from warmfleet.local.state_view import check_state

SMALL = "enginePreset: tiny-cpu\npromptTokens: 256\noutputTokens: 32\nburstDurationS: 120\n"


def _whatif(tmp_path: Path, params: str) -> Result:
    path = tmp_path / "p.yaml"
    path.write_text(params)
    out = tmp_path / "fleet.json"
    return CliRunner().invoke(app, ["fleet", "whatif", "--params", str(path), "--out", str(out)])


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ("", "got an empty document"),
        ("# only a comment\n", "got an empty document"),
        ("[]\n", "got a list"),
        ("false\n", "got true/false"),
        ("0\n", "got a number"),
        ("warmNodes: 500\n", "warmNodes: Value error, 500 warm nodes, more than nodesTotal (12)"),
    ],
)
def test_whatif_params_must_be_a_consistent_mapping(tmp_path: Path, params: str, said: str) -> None:
    result = _whatif(tmp_path, params)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert said in result.output
    assert not (tmp_path / "fleet.json").exists()


def test_whatif_shows_its_progress(tmp_path: Path) -> None:
    """Piped: a start and an end line for the calibration and for each scenario."""
    result = _whatif(tmp_path, SMALL + "calibrationRequests: 30\n")
    assert result.exit_code == 0, result.output
    for step in ("calibrating one replica", "what-if cold", "what-if weights+image"):
        assert f"{step}: started" in result.output
        assert f"{step}: done" in result.output
    report = json.loads((tmp_path / "fleet.json").read_text())
    assert report["whatif"]["params"]["warm_nodes"] == 6


def _running(state: dict[str, Any], workdir: Path, port: int) -> Path:
    """``state`` as a running fleet's (this process, a listening gateway) in ``workdir``."""
    workdir.mkdir()
    doc = {**state, "running": True, "pid": os.getpid(), "gateway": f"http://127.0.0.1:{port}"}
    (workdir / "state.json").write_text(json.dumps(doc))
    return workdir


@pytest.mark.parametrize(
    ("state", "field"),
    [
        ({"endpoints": "x", "nodes": [1]}, "endpoints: Input should be a valid list"),
        ({"endpoints": [{"status": None}]}, "endpoints.0.name: Field required"),
        ({"nodes": [{"name": "n", "budgetBytes": "5", "readyLabels": []}]}, "budgetBytes"),
        ({"starts": {"warmStartS": "soon"}}, "starts.warmStartS"),
    ],
)
def test_status_of_a_state_of_another_shape_is_one_line(
    tmp_path: Path, state: dict[str, Any], field: str
) -> None:
    with busy_port() as port:
        workdir = _running(state, tmp_path / "w", port)
        result = CliRunner().invoke(app, ["status", "--workdir", str(workdir)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "not the state `warmfleet up` writes" in result.output
    assert field in result.output


def test_status_of_a_state_that_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("[1, 2]")
    result = CliRunner().invoke(app, ["status", "--workdir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "not a JSON object" in result.output


# What `up` wrote for a small fleet (trimmed to one of each; the names are its own)
REAL_STATE: dict[str, Any] = {
    "running": True, "pid": 1, "uptimeS": 12.5, "passes": 30, "lastPassS": 0.002,
    "gateway": "http://127.0.0.1:28123", "origin": "http://127.0.0.1:28124", "originPid": 2,
    "endpoints": [{"name": "demo", "status": {
        "phase": "Ready", "revision": "34856f79", "replicas": 1, "readyReplicas": 1,
        "unpreparedReplicaShare": 0.0, "weightsCache": {"name": "demo-w", "state": "Ready"},
        "replicaStatus": [], "conditions": []}}],
    "caches": [{"name": "demo-w", "owner": "demo", "source": {"uri": "origin://m",
        "revision": "v1"}, "status": {"state": "Ready", "readyNodes": 1, "targetNodes": 1}}],
    "nodes": [{"name": "node-a", "budgetBytes": 1_000_000_000, "agentPid": 3, "agentUp": True,
        "readyLabels": ["weights.warmfleet.dev/demo-w"], "assigned": ["demo-w"],
        "caches": {"demo-w": {"state": "ready", "bytesDone": 10, "bytesTotal": 10,
                              "healthy": True}}}],
    "replicas": [{"name": "demo-main-1", "deployment": "demo-main", "endpoint": "demo",
        "variant": "main", "node": "node-a", "pid": 4, "state": "ready", "prepared": True,
        "url": "http://127.0.0.1:38283", "loadSource": "node-cache", "timeToReadyS": 0.75,
        "weightsLoadS": 0.014, "weightsBytes": 10}],
    "starts": {"warmStartS": 0.75, "coldStartS": None, "warmWeightsLoadS": 0.014,
        "coldWeightsLoadS": None, "warmStarts": 1, "coldStarts": 0,
        "unpreparedReplicaShare": 0.0},
    "history": [], "events": [],
}  # fmt: skip


def test_the_state_up_writes_passes_the_check(tmp_path: Path) -> None:
    check_state(REAL_STATE, tmp_path / "state.json")
    with busy_port() as port:
        workdir = _running(REAL_STATE, tmp_path / "w", port)
        result = CliRunner().invoke(app, ["status", "--workdir", str(workdir)])
    assert result.exit_code == 0, result.output
    assert "demo-main-1" in result.output
