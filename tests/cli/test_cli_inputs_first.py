"""What a command is handed is checked before its work, and a bad one is the command's own one
line: a file it cannot read (not click's box), a count over its bound, an output path it could
not write at the end of a run, a cache root that does not exist (never created by a look)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import assert_short_failure, closed_port, run_cli
from typer.main import get_command
from typer.testing import CliRunner, Result

from warmfleet.cli import app
from warmfleet.emulator.cli import _write_ports_file

# The gateway's commands (its owner's to change): `serve --config` still lets click check it.
NOT_YET = {("serve", "config")}
TRACE = '{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def _one_line(result: Result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    return lines[0]


def _path_params(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(command path, parameter) of every parameter whose annotation holds ``Path``."""
    if hasattr(command, "list_commands"):
        for name in command.list_commands(None):
            yield from _path_params(command.get_command(None, name), (*path, name))
        return
    for param in command.params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is not None and "Path" in str(descriptor.annotation):
            yield path, param


def test_path_options_leave_reading_to_the_command() -> None:
    """click's readable check runs before the command: a refused read would be its box."""
    found = list(_path_params(get_command(app)))
    assert len(found) > 20
    checked = [
        (" ".join(path), param.name)
        for path, param in found
        if param.type_descriptor.parameter_info.readable and (path[-1], param.name) not in NOT_YET
    ]
    assert checked == []


@pytest.fixture
def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file no one may read: mode 000, and ``os.access`` says so even to root."""
    path = tmp_path / "noperm.yaml"
    path.write_text("bogus: [\n")
    path.chmod(0)
    real = os.access

    def access(target: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if Path(target) == path and mode & os.R_OK:
            return False
        return real(target, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("up", "{f}"),
        ("status", "{f}"),
        ("doctor", "{f}"),
        ("sim", "--scenario", "mooncake", "--trace", "{f}"),
        ("sim", "--trace", "{f}"),
        ("emulate", "-c", "{f}"),
        ("cache", "agent", "--config", "{f}"),
        ("cache", "ls", "--config", "{f}"),
        ("fleet", "whatif", "--params", "{f}"),
    ],
)
def test_a_refused_read_is_the_commands_one_line(refused: Path, args: tuple[str, ...]) -> None:
    result = _invoke(*(a.format(f=refused) for a in args))
    line = _one_line(result)
    assert "is not readable" not in line
    assert str(refused.name) in line


def test_operator_kubeconfig_is_read_by_the_command(refused: Path) -> None:
    result = _invoke("fleet", "operator", "--kubeconfig", str(refused))
    assert "is not readable" not in result.output
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(
    "args",
    [
        ("sim", "--scenario", "gsp", "--instances", "10001"),
        ("sim", "--scenario", "gsp", "--gateway-replicas", "1,10001"),
        ("doctor", "{t}", "--instances", "10001"),
        ("doctor", "{t}", "--gateway-replicas", "10001"),
    ],
)
def test_instances_and_gateway_replicas_are_bounded(tmp_path: Path, args: tuple[str, ...]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE)
    result = _invoke(*(a.format(t=trace) for a in args))
    assert result.exit_code == 2, result.output
    assert "10000" in result.output
    assert "hashing" not in result.output  # refused before any work


def _small_sim(*extra: str) -> Result:
    return _invoke(
        "sim", "--scenario", "gsp", "--requests", "8", "--preset", "tiny-cpu", "--instances",
        "2", "--strategies", "random", *extra,
    )  # fmt: skip


def test_sim_outputs_are_checked_before_the_run(tmp_path: Path) -> None:
    directory, file = tmp_path / "d", tmp_path / "f"
    directory.mkdir()
    file.write_text("")
    cases = {
        ("--json", str(directory)): "is a directory",
        ("--json", str(file / "x.json")): "is not a directory",
        ("--report", str(file)): "is a file, not a directory",
    }
    for extra, said in cases.items():
        line = _one_line(_small_sim(*extra))  # one line: no progress, no table
        assert extra[0] in line
        assert said in line


def test_an_unwritable_output_directory_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory the user may not write in (root may write anywhere: ``os.access`` says no)."""
    locked = tmp_path / "ro"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, *a, **k: Path(p) != locked and real(p, mode, *a, **k)
    )
    line = _one_line(_small_sim("--json", str(locked / "b.json")))
    assert f"cannot write in {locked}" in line
    line = _one_line(_invoke("doctor", str(tmp_path / "t.jsonl"), "--report", str(locked)))
    assert "--report" in line


def test_doctor_demo_and_bench_outputs_are_checked_before_the_run(tmp_path: Path) -> None:
    trace, directory = tmp_path / "t.jsonl", tmp_path / "d"
    trace.write_text(TRACE)
    directory.mkdir()
    assert "--json" in _one_line(_invoke("doctor", str(trace), "--json", str(directory)))
    assert "--report" in _one_line(_invoke("demo-sim", "--report", str(trace)))
    url = f"http://127.0.0.1:{closed_port()}"
    bench = _invoke("bench", "--url", url, "--scenario", "gsp", "--json", str(directory))
    assert "--json" in _one_line(bench)  # not "cannot reach": checked before the URLs
    conformance = _invoke("conformance", "--engine", url, "--out", str(directory))
    assert conformance.exit_code == 2
    assert "--out" in conformance.output


@pytest.mark.parametrize("command", [("ls",), ("verify",), ("pin", "abcdef12"), ("gc",)])
def test_looking_at_a_missing_cache_root_does_not_create_it(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    root = tmp_path / "typo"
    line = _one_line(_invoke("cache", *command, "--dest", str(root)))
    assert f"no cache at {root}" in line
    assert not root.exists()


def test_listing_the_default_cache_root_on_a_fresh_machine_is_an_empty_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMFLEET_CACHE_ROOT", str(tmp_path / "fresh"))
    result = _invoke("cache", "ls")
    assert result.exit_code == 0, result.output


def test_emulate_checks_its_ports_file_before_binding(tmp_path: Path) -> None:
    ports = tmp_path / "d"
    ports.mkdir()
    done = run_cli("emulate", "-n", "1", "--base-port", "0", "--ports-file", str(ports))
    assert "--ports-file" in assert_short_failure(done, 2)
    assert not (tmp_path / "d.tmp").exists()


def test_a_ports_file_in_a_directory_not_made_yet_is_written(tmp_path: Path) -> None:
    target = tmp_path / "new" / "ports.json"
    _write_ports_file(target, {"urls": []})
    assert json.loads(target.read_text()) == {"urls": []}


def test_a_ports_file_that_cannot_be_replaced_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        _write_ports_file(target, {"urls": []})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
