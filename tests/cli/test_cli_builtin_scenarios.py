"""Every built-in scenario runs on a fresh install: ``warmfleet sim`` (the installed script, in a
subprocess) from a directory with no ``../shared`` beside it, by default and with an empty
``$WARMFLEET_TRACES_DIR``. The trace-driven ones then run their synthetic equivalents, and say
so. An explicit ``--traces-dir`` must hold the trace (and a generated scenario takes none)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_support import WARMFLEET

from warmfleet.edge import TRACES_DIR_ENV
from warmfleet.sim.scenario import BUILTIN_WORKLOADS
from warmfleet.sim.workloads.traces import DEFAULT_TRACES


def _run(
    name: str, cwd: Path, traces: Path | None, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``warmfleet sim`` on 40 requests of ``name`` from ``cwd`` (``traces``: the traces
    directory of the environment, else none), writing ``cwd/out.json``."""
    out = cwd / "out.json"
    args = [
        "sim", "--scenario", name, "--requests", "40", "--preset", "tiny-cpu", "--instances",
        "2", "--strategies", "random,prefix_affinity", "--json", str(out), *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != TRACES_DIR_ENV}
    if traces is not None:
        env[TRACES_DIR_ENV] = str(traces)
    return subprocess.run(
        [WARMFLEET, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _sim(name: str, cwd: Path, traces: Path | None) -> tuple[str, dict[str, object]]:
    """``_run`` succeeded: (stdout, JSON report)."""
    done = _run(name, cwd, traces)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report: dict[str, object] = json.loads((cwd / "out.json").read_text(encoding="utf-8"))
    return done.stdout, report


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILTIN_WORKLOADS))
def test_every_built_in_scenario_runs_without_traces(name: str, tmp_path: Path) -> None:
    fresh = tmp_path / "home" / "project"  # no ../shared/traces from here
    fresh.mkdir(parents=True)
    empty = tmp_path / "traces"
    empty.mkdir()
    for traces in (None, empty):
        stdout, report = _sim(name, fresh, traces)
        assert report["scenario"] == name
        assert report["requests"] == 40
        assert set(report["strategies"]) == {"random", "prefix_affinity"}  # type: ignore[call-overload]
        if name in DEFAULT_TRACES:
            said = f"workload: synthetic equivalent of {DEFAULT_TRACES[name]}"
            assert stdout.startswith(said), stdout
            assert str(report["workload"]).startswith("synthetic equivalent of ")
        else:
            assert report["workload"] == "generated"


def test_an_explicit_traces_dir_must_hold_the_trace(tmp_path: Path) -> None:
    """``--traces-dir`` given: a trace-driven scenario whose file is not there, or a generated
    scenario (it reads no trace), is one line and exit 2 before any run, not a synthetic
    stand-in or a flag ignored."""
    empty = tmp_path / "traces"
    empty.mkdir()
    missing = tmp_path / "missing.jsonl"
    cases = {
        (
            "mooncake",
            "--traces-dir",
            str(empty),
        ): f"{empty / DEFAULT_TRACES['mooncake']}: cannot read",
        ("gsp", "--traces-dir", str(empty)): "gsp generates its requests, it replays no trace",
        ("gsp", "--trace", str(missing)): "gsp generates its requests, it replays no trace",
    }
    for (name, *extra), said in cases.items():
        done = _run(name, tmp_path, None, *extra)
        assert done.returncode == 2, f"{done.stdout}\n{done.stderr}"
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert said in done.stderr, done.stderr
        assert not (tmp_path / "out.json").exists()
