"""``warmfleet status`` output: tables that fit 100 columns, ``--wide``, TSV and JSON, sizes and
times rounded for people."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from warmfleet.display import OutputFormat
from warmfleet.local import cli as local_cli
from warmfleet.local.state import STATE_FILE, render, starts_line

app = typer.Typer()
local_cli.register(app)


def _doc(gateway: str) -> dict[str, Any]:
    source = {"uri": "http://127.0.0.1:41234/models/tiny-model-with-a-long-name", "revision": "r2"}
    cache = {"state": "Ready", "bytesDone": 6_000_000, "bytesTotal": 6_000_000, "healthy": True}
    return {
        "running": True, "pid": os.getpid(), "uptimeS": 123.456789, "gateway": gateway,
        "origin": "http://127.0.0.1:41234",
        "endpoints": [{"name": "chat", "status": {
            "phase": "Ready", "revision": "7f3a9c2e", "replicas": 2, "readyReplicas": 2,
            "unpreparedReplicaShare": 0.3333333333333333}}],
        "caches": [{"name": "chat-weights-7f3a9c2e", "owner": "chat", "source": source,
                    "status": {"state": "Ready", "readyNodes": 2, "targetNodes": 2}}],
        "nodes": [{"name": f"node-{x}", "budgetBytes": 30_000_000, "agentPid": 4242 + i,
                   "agentUp": True, "readyLabels": ["warmfleet.dev/cache-chat-weights-7f3a9c2e"],
                   "caches": {"chat-weights-7f3a9c2e": cache}} for i, x in enumerate("ab")],
        "replicas": [{"name": f"chat-7f3a9c2e-{i}", "node": "node-a", "state": "ready",
                      "loadSource": "node-cache", "timeToReadyS": 1.23456789,
                      "url": f"http://127.0.0.1:{45000 + i}"} for i in range(2)],
        "starts": {"warmStartS": 1.23456789, "coldStartS": None, "warmWeightsLoadS": 0.0421,
                   "coldWeightsLoadS": None, "warmStarts": 2, "coldStarts": 0,
                   "unpreparedReplicaShare": 0.0},
    }  # fmt: skip


def _table(width: int, *, wide: bool = False) -> str:
    out = io.StringIO()
    render(_doc("http://127.0.0.1:1"), Console(file=out, width=width), wide=wide)
    return out.getvalue()


def test_status_tables_fit_100_columns_with_rounded_figures() -> None:
    text = _table(100)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "…" not in text
    assert "up 123 s" in text
    assert "30.0 MB" in text
    assert "6.0 MB/6.0 MB" in " ".join(text.split())
    assert "1.23 s" in text
    assert "33%" in text
    assert "1.23456789" not in text
    assert "median time to ready: warm 1.23 s (weights 0.0421 s, 2 starts); cold: none yet" in text
    narrow = _table(60)
    assert max(len(line) for line in narrow.splitlines()) <= 60
    assert "hidden:" in narrow
    wide = _table(60, wide=True)
    assert "hidden:" not in wide
    assert "http://127.0.0.1:45001" in wide


def test_starts_line_without_any_start() -> None:
    assert starts_line({}) == (
        "median time to ready: warm: none yet; cold: none yet; replicas started unprepared: -"
    )


@pytest.fixture
def listening() -> Iterator[str]:
    """A socket that accepts connections: the running fleet's gateway, as status checks it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_status_cli_tsv_and_json(tmp_path: Path, listening: str) -> None:
    doc = _doc(listening)
    (tmp_path / STATE_FILE).write_text(json.dumps(doc), encoding="utf-8")
    args = ["status", "--workdir", str(tmp_path), "--format"]
    shown = CliRunner().invoke(app, [*args, OutputFormat.json.value])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output) == doc
    tsv = CliRunner().invoke(app, [*args, "tsv"])
    assert tsv.exit_code == 0, tsv.output
    sections = tsv.output.split("\n\n")
    assert [s.splitlines()[0] for s in sections] == [
        "# endpoints",
        "# caches",
        "# nodes",
        "# replicas",
    ]
    replicas = list(csv.reader(io.StringIO(sections[3].split("\n", 1)[1]), delimiter="\t"))
    assert replicas[0] == ["name", "node", "state", "weights from", "time to ready", "url"]
    assert replicas[2][5] == "http://127.0.0.1:45001"
