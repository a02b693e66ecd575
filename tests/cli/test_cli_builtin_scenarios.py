"""Every built-in scenario runs on a fresh install: ``warmfleet sim`` (the installed script, in a
subprocess) from a directory with no ``../shared`` beside it, by default and with an empty
``--traces-dir``. The trace-driven ones then run their synthetic equivalents, and say so."""

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


def _sim(name: str, cwd: Path, *extra: str) -> tuple[str, dict[str, object]]:
    """``warmfleet sim`` on 40 requests of ``name`` from ``cwd``: (stdout, JSON report)."""
    out = cwd / "out.json"
    args = [
        "sim", "--scenario", name, "--requests", "40", "--preset", "tiny-cpu", "--instances",
        "2", "--strategies", "random,prefix_affinity", "--json", str(out), *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != TRACES_DIR_ENV}
    done = subprocess.run(
        [WARMFLEET, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report: dict[str, object] = json.loads(out.read_text(encoding="utf-8"))
    return done.stdout, report


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILTIN_WORKLOADS))
def test_every_built_in_scenario_runs_without_traces(name: str, tmp_path: Path) -> None:
    fresh = tmp_path / "home" / "project"  # no ../shared/traces from here
    fresh.mkdir(parents=True)
    empty = tmp_path / "traces"
    empty.mkdir()
    for extra in ((), ("--traces-dir", str(empty))):
        stdout, report = _sim(name, fresh, *extra)
        assert report["scenario"] == name
        assert report["requests"] == 40
        assert set(report["strategies"]) == {"random", "prefix_affinity"}  # type: ignore[call-overload]
        if name in DEFAULT_TRACES:
            said = f"workload: synthetic equivalent of {DEFAULT_TRACES[name]}"
            assert stdout.startswith(said), stdout
            assert str(report["workload"]).startswith("synthetic equivalent of ")
        else:
            assert report["workload"] == "generated"
