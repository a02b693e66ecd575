"""bench-peers' switchback part: paired cycles, bootstrap intervals, the issue 22 checks on
them, the shuffled slice order, and a short run against real routers (every process stopped)."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warmfleet.bench.live_procs import ProcessSet
from warmfleet.bench.peers import FAST_FLEET, overhead_workload
from warmfleet.bench.peers_routers import PROTOCOL_PASSTHROUGH, PeerPaths, RouterSpec
from warmfleet.bench.peers_switchback import SwitchPoint, cycle_orders, run_switchback
from warmfleet.bench.peers_switchback_report import (
    SliceResult,
    bootstrap_ci,
    paired_added,
    switch_acceptance,
    switch_row,
)

POINT = {"name": "c32_8k", "concurrency": 32, "stream": False}


def _slice(cycle: int, latencies: list[float], cpu_s: float | None = None) -> SliceResult:
    return SliceResult(cycle, tuple(latencies), len(latencies) + 2, 0, cpu_s)


def test_added_pairs_each_router_slice_with_directs_of_the_same_cycle() -> None:
    direct = [_slice(0, [10.0, 11.0, 12.0]), _slice(1, [20.0]), _slice(2, [5.0])]
    router = [_slice(1, [21.0, 23.0]), _slice(0, [13.0]), _slice(2, [])]
    # cycle 1: 22 - 20, cycle 0: 13 - 11; cycle 2 kept no request and is left out
    assert paired_added(router, direct) == [2.0, 2.0]


def test_bootstrap_interval_brackets_the_median_and_is_seeded() -> None:
    values = [float(v) for v in range(1, 41)]
    low, high = bootstrap_ci(values, statistics.median, random.Random(3))
    assert low < statistics.median(values) < high
    assert (low, high) == bootstrap_ci(values, statistics.median, random.Random(3))
    assert bootstrap_ci([4.0] * 10, statistics.median, random.Random(0)) == (4.0, 4.0)
    assert bootstrap_ci([7.0], statistics.median, random.Random(0)) == (7.0, 7.0)
    shifted = [5.0 + random.Random(i).gauss(0.0, 0.5) for i in range(30)]
    low, high = bootstrap_ci(shifted, statistics.median, random.Random(1))
    assert 4.0 < low < high < 6.0


def test_a_router_row_has_paired_added_and_cpu_over_its_own_requests() -> None:
    direct = [_slice(c, [10.0, 10.0, 10.0]) for c in range(6)]
    router = [_slice(c, [12.0 + c, 12.0 + c, 12.0 + c], cpu_s=0.5) for c in range(6)]
    row = switch_row(("warmfleet", "random"), POINT, router, direct, random.Random(0))
    assert row["added_p50_ms"] == pytest.approx(4.5)  # diffs 2..7
    low, high = row["added_ci_ms"]
    assert 2.0 <= low < 4.5 < high <= 7.0
    assert row["router_cpu_ms_per_request"] == pytest.approx(1000.0 * 3.0 / 30)
    assert row["requests"] == 30
    assert row["cycles"] == 6
    assert row["errors"] == 0
    assert row["p50_ms"] == pytest.approx(14.5)
    alone = switch_row(("direct", "client_round_robin"), POINT, direct, direct, random.Random(0))
    assert alone["added_p50_ms"] is None
    assert alone["router_cpu_ms_per_request"] is None


def _row(who: tuple[str, str], point: str, **fields: Any) -> dict[str, Any]:
    return {"router": who[0], "policy": who[1], "load_point": point, **fields}


def test_checks_compare_sync_with_vllm_router_and_say_when_intervals_overlap() -> None:
    sync, vllm = ("warmfleet", "prefix_affinity+sync"), ("vllm-router", "round_robin")
    rows = [
        _row(sync, "c32_8k", router_cpu_ms_per_request=0.18, router_cpu_ci_ms=[0.17, 0.19],
             added_p50_ms=3.0, added_ci_ms=[2.0, 4.0]),
        _row(vllm, "c32_8k", router_cpu_ms_per_request=0.15, router_cpu_ci_ms=[0.14, 0.16],
             added_p50_ms=3.5, added_ci_ms=[2.5, 4.5]),
        _row(sync, "c1_8k", added_p50_ms=0.30, added_ci_ms=[0.28, 0.32]),
    ]  # fmt: skip
    checks = {c["check"]: c for c in switch_acceptance(rows)}
    cpu = checks["22. router CPU ms/request at c=32"]
    assert (cpu["value"], cpu["limit"], cpu["pass"], cpu["apart"]) == (0.18, 0.15, False, True)
    p50 = checks["22. added p50 ms at c=32"]
    assert (p50["pass"], p50["apart"]) == (True, False)
    assert checks["22. added p50 ms at c=1"]["pass"] is None  # vllm-router not measured
    assert checks["22. streamed TTFT added ms at c=32"]["value"] is None


def test_each_cycle_is_a_shuffled_permutation() -> None:
    labels = ["direct", "a", "b", "c"]
    orders = cycle_orders(labels, 20, random.Random(0))
    assert all(sorted(order) == sorted(labels) for order in orders)
    assert len({tuple(order) for order in orders}) > 5
    assert orders == cycle_orders(labels, 20, random.Random(0))


@pytest.mark.slow
async def test_a_short_switchback_measures_every_router_and_stops_them(tmp_path: Path) -> None:
    procs = ProcessSet(tmp_path)
    routers = [
        RouterSpec("direct", "client_round_robin"),
        RouterSpec(PROTOCOL_PASSTHROUGH, "round_robin"),
        RouterSpec("warmfleet", "random"),
    ]
    point = SwitchPoint("c4", 4, True, 2, 0.3)
    rows = await run_switchback(
        procs, PeerPaths(None, None), routers, dict(FAST_FLEET), overhead_workload(64),
        instances=2, points=[point],
    )  # fmt: skip
    assert [(r["router"], r["load_point"]) for r in rows] == [
        ("direct", "c4"), (PROTOCOL_PASSTHROUGH, "c4"), ("warmfleet", "c4"),
    ]  # fmt: skip
    for row in rows:
        assert row["errors"] == 0
        assert row["cycles"] == 2
        assert row["requests"] > 8
        assert row["stream"] is True
        assert row["p50_ms"] > 0
        assert 0.0 <= row["foreign_cpu_frac"] <= 1.0
        assert row["noisy"] is (row["foreign_cpu_frac"] > 0.15)
    assert rows[0]["router_cpu_ms_per_request"] is None
    for row in rows[1:]:
        assert row["added_p50_ms"] is not None
        assert row["router_cpu_ms_per_request"] > 0
    assert procs.children == []  # each stopped (by PID) and let go


def test_an_unknown_part_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    argv = [sys.executable, "-m", "warmfleet.bench.peers", "--parts", "overhead,switchbak"]
    done = subprocess.run(
        [*argv, "--out", str(out)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    message = "error: --parts: switchbak: not one of overhead, switchback, quality\n"
    assert done.stderr == message  # one line
    assert not out.exists()
