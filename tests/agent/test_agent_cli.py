"""`warmfleet cache ...` end to end on a local-path source (in-process CLI runner)."""

from __future__ import annotations

import json
import os

from typer.testing import CliRunner

from warmfleet.agent.cli import cache_app as app  # registered as `warmfleet cache`

runner = CliRunner()


def _cache(*args: str) -> object:
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_cli_prefetch_ls_pin_gc_verify(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(200_000))
    (src / "config.json").write_text("{}")
    dest = str(tmp_path / "cache")
    res = _cache("prefetch", str(src), "--dest", dest, "--budget", "10MB", "--json")
    assert res.exit_code == 0, res.output
    key = json.loads(res.output)["key"]
    listed = json.loads(_cache("ls", "--dest", dest, "--json").output)
    assert [(d["key"], d["state"], d["bytes_done"]) for d in listed] == [(key, "ready", 200_002)]
    assert _cache("pin", key[:12], "--dest", dest).exit_code == 0
    assert "evicted 0" in _cache("gc", "--all", "--dest", dest).output
    assert _cache("unpin", "model", "--dest", dest).exit_code == 0
    assert _cache("verify", "--full", "--dest", dest).exit_code == 0
    assert "evicted 1" in _cache("gc", "--all", "--dest", dest).output
    assert json.loads(_cache("ls", "--dest", dest, "--json").output) == []


def test_cli_reports_capacity_shortfall(tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * 100_000)
    res = runner.invoke(
        app, ["prefetch", str(src), "--dest", str(tmp_path / "c"), "--budget", "50KB"]
    )
    assert res.exit_code == 1
    assert "short by" in res.output
