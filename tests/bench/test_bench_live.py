"""The live demo's plumbing on a tiny emulated fleet: report shape, and no child outlives it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from warmfleet.bench import live_fleet
from warmfleet.bench.live_demo import DemoConfig, run_live_demo
from warmfleet.bench.live_fleet import routing_for, start_fleet, start_gateway
from warmfleet.bench.live_procs import ProcessError, ProcessSet, free_port
from warmfleet.sim.runner import run_comparison
from warmfleet.sim.scenario import builtin_scenario

pytestmark = pytest.mark.e2e

TINY = DemoConfig(
    instances=2, groups=4, requests=12, prefix_words=200, question_words=20, output_tokens=4,
    concurrency=2, speedup=50.0, max_run_s=30.0,
)  # fmt: skip


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (children of the code under test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.slow
async def test_live_demo_report_has_the_simulator_shape(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    report = await run_live_demo(
        tmp_path / "report", TINY, strategies=("prefix_affinity",), log_dir=logs
    )
    scenario = builtin_scenario("gsp", 2, "tiny-cpu", 0).model_copy(update={"requests": 20})
    sim = run_comparison(scenario, ["random"])
    sim_report = sim.report()
    assert set(sim_report) <= set(report)
    assert list(report["strategies"]) == ["prefix_affinity"]
    sim_run = sim_report["strategies"]["random"]  # type: ignore[index]
    for name, run in report["strategies"].items():
        assert set(sim_run) <= set(run), name
        assert run["requests"]["completed"] == 12
        assert run["hit_rate_source"] == "engine_metrics"
        assert set(run["share"]["per_instance"]) == {"emu-0", "emu-1"}
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert written["instances"] == 2
    assert (tmp_path / "report" / "ttft_cdf.png").exists()
    assert processes_mentioning(str(logs)) == []


@pytest.mark.slow
async def test_failure_midway_stops_every_child(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with pytest.raises(ProcessError):
        # The gateway rejects the unknown strategy and exits; the fleet must be stopped too.
        await run_live_demo(tmp_path / "r", TINY, strategies=("no_such_strategy",), log_dir=logs)
    assert (logs / "fleet-no_such_strategy.json").exists()
    assert processes_mentioning(str(logs)) == []


@pytest.mark.slow
async def test_fleet_and_gateway_start_again_when_their_port_was_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port picked as free can be taken before the child binds it: the start is retried on
    other ports (and the failed child stopped) instead of failing the benchmark."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        firsts = {"fleet": [taken], "gateway": [taken]}
        # live_fleet calls the free_port it imports from live_procs (the same function)
        pick_base, pick_port = live_fleet.consecutive_free_ports, free_port
        monkeypatch.setattr(
            live_fleet,
            "consecutive_free_ports",
            lambda count: firsts["fleet"].pop() if firsts["fleet"] else pick_base(count),
        )
        monkeypatch.setattr(
            live_fleet,
            "free_port",
            lambda: firsts["gateway"].pop() if firsts["gateway"] else pick_port(),
        )
        procs = ProcessSet(tmp_path)
        try:
            spec = {"preset": "tiny-cpu", "speedup": 50.0, "seed": 0}
            fleet = await start_fleet(procs, name="fleet", instances=1, spec=spec)
            gateway = await start_gateway(procs, fleet, routing_for("random"))
            assert firsts == {"fleet": [], "gateway": []}  # both first tries hit the taken port
            assert taken not in {int(u.rsplit(":", 1)[1]) for u in (*fleet.urls, gateway.url)}
            assert [c.name for c in procs.children] == ["fleet", "gateway"]
        finally:
            procs.stop_all()


@pytest.mark.slow
def test_sigint_stops_every_child(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # SIGINT as at a terminal: a shell without job control (CI's) starts its background jobs
    # with SIGINT ignored, and an ignored SIGINT stays ignored across exec.
    code = (
        "import asyncio, signal, sys\nfrom pathlib import Path\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from warmfleet.bench.live_demo import DemoConfig, run_live_demo\n"
        "config = DemoConfig(instances=2, groups=4, prefix_words=200, requests=4000,\n"
        "                    concurrency=2, max_run_s=120.0)\n"
        "asyncio.run(run_live_demo(Path(sys.argv[1]), config, log_dir=Path(sys.argv[2])))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "r"), str(logs)])
    leftovers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (logs / "gateway-random.json").exists():
            time.sleep(0.2)
        assert (logs / "gateway-random.json").exists()
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        leftovers = processes_mentioning(str(logs))
        for pid in leftovers:  # the demo's children, left running: never past this test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert leftovers == []
