"""`warmfleet cache ...` end to end on a local-path source (in-process CLI runner)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner, Result

from warmfleet.agent.cli import cache_app as app  # registered as `warmfleet cache`

runner = CliRunner()


def _cache(*args: str) -> Result:
    return runner.invoke(app, list(args), catch_exceptions=False)


# The default reserve is 5 % of the file system (at most 10 GiB): a nearly full CI disk would
# refuse the tests' artifacts. They state their own.
NO_RESERVE = ("--reserve", "0")


def test_cli_prefetch_ls_pin_gc_verify(tmp_path: Path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(200_000))
    (src / "config.json").write_text("{}")
    dest = str(tmp_path / "cache")
    res = _cache("prefetch", str(src), "--dest", dest, "--budget", "10MB", *NO_RESERVE, "--json")
    assert res.exit_code == 0, res.output
    key = json.loads(res.output)["key"]
    listed = json.loads(_cache("ls", "--dest", dest, "--json").output)
    assert [(d["key"], d["state"], d["bytes_done"]) for d in listed] == [(key, "ready", 200_002)]
    assert _cache("pin", key[:12], "--dest", dest).exit_code == 0
    assert "evicted 0" in _cache("gc", "--all", "--dest", dest, *NO_RESERVE).output
    assert _cache("unpin", "model", "--dest", dest).exit_code == 0
    assert _cache("verify", "--full", "--dest", dest).exit_code == 0
    assert "evicted 1" in _cache("gc", "--all", "--dest", dest, *NO_RESERVE).output
    assert json.loads(_cache("ls", "--dest", dest, "--json").output) == []


def test_cli_reports_capacity_shortfall(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(b"x" * 100_000)
    res = runner.invoke(
        app, ["prefetch", str(src), "--dest", str(tmp_path / "c"), "--budget", "50KB"]
    )
    assert res.exit_code == 1
    assert "short by" in res.output


def test_cli_reserve_option_is_applied(tmp_path: Path) -> None:
    """``--reserve`` replaces the default (5 % of the file system): a reserve larger than the
    disk refuses even a tiny artifact and says so."""
    src = tmp_path / "small.bin"
    src.write_bytes(b"x" * 1_000)
    args = ["prefetch", str(src), "--dest", str(tmp_path / "c"), "--budget", "10MB"]
    res = runner.invoke(app, [*args, "--reserve", "1000TB"])
    assert res.exit_code == 1
    assert "reserve 1000000000000000)" in " ".join(res.output.split())
    assert runner.invoke(app, [*args, *NO_RESERVE]).exit_code == 0
    bad = runner.invoke(app, [*args, "--reserve", "lots"])
    assert bad.exit_code == 2  # a usage error naming the option, not a traceback
    assert "--reserve" in bad.output
