"""`warmfleet cache ...` end to end on a local-path source (in-process CLI runner)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
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


def _two_artifacts(tmp_path: Path) -> str:
    """Two versions of one name ("weights") in a cache; its root."""
    dest = str(tmp_path / "cache")
    for i in range(2):
        src = tmp_path / f"v{i}"
        src.mkdir()
        (src / "w.bin").write_bytes(os.urandom(30_000 * (i + 1)))
        args = ("prefetch", str(src), "--dest", dest, "--name", "weights", *NO_RESERVE)
        assert _cache(*args, "--json").exit_code == 0
    return dest


def test_cli_ls_shows_key_prefixes_pin_and_verify_accept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cache ls`` at 100 columns: no line wider, sizes in decimal units, and the key column a
    prefix (never cut by an ellipsis) that pin, unpin and verify take."""
    monkeypatch.setenv("COLUMNS", "100")
    dest = _two_artifacts(tmp_path)
    res = _cache("ls", "--dest", dest)
    assert max(len(line) for line in res.output.splitlines()) <= 100
    assert "30.0 kB" in res.output
    assert "60.0 kB" in res.output
    assert "…" not in res.output
    full = {d["key"] for d in json.loads(_cache("ls", "--dest", dest, "--format", "json").output)}
    rows = list(csv.reader(io.StringIO(_cache("ls", "--dest", dest, "--format", "tsv").output),
                           delimiter="\t"))  # fmt: skip
    assert rows[0][:4] == ["key", "name", "state", "size"]
    prefixes = [row[0] for row in rows[1:]]
    assert len(prefixes) == 2
    assert all(len(p) < 64 for p in prefixes)
    assert {next(k for k in full if k.startswith(p)) for p in prefixes} == full
    pinned = _cache("pin", prefixes[0], "--dest", dest)
    assert (pinned.exit_code, pinned.output.strip()) == (0, f"pinned {prefixes[0]}")
    listed = _cache("ls", "--dest", dest, "--format", "tsv").output
    assert f"{prefixes[0]}\tweights\tready" in listed
    assert "\tyes\t" in listed
    checked = _cache("verify", prefixes[1], "--dest", dest)
    assert (checked.exit_code, checked.output.strip()) == (0, f"{prefixes[1]} ok")
    assert _cache("unpin", prefixes[0], "--dest", dest).exit_code == 0


@pytest.mark.parametrize(
    ("command", "key", "why"),
    [
        ("pin", "weights", "'weights' is ambiguous; matching keys:"),
        ("verify", "0000000000", "no cached artifact matches '0000000000'"),
        ("unpin", "abc", "(a key prefix needs at least 6 characters)"),
    ],
)
def test_cli_unknown_or_ambiguous_key_is_one_line_and_exit_2(
    tmp_path: Path, command: str, key: str, why: str
) -> None:
    dest = _two_artifacts(tmp_path)
    res = runner.invoke(app, [command, key, "--dest", dest])
    assert res.exit_code == 2
    assert res.output.startswith(f"warmfleet cache {command}: ")
    assert why in res.output
    assert len(res.output.strip().splitlines()) == 1
