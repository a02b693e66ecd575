"""Scale-out what-if: ordering of the three scenarios and the AWS-figure derivations."""

from __future__ import annotations

from typing import cast

import pytest

from warmfleet.api.resources import AutoscalingSpec
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.sim.whatif import WhatIfParams, calibrate, run_scenario, run_whatif

SMALL = WhatIfParams(
    engine_preset="tiny-cpu",
    prompt_tokens=256,
    output_tokens=32,
    base_rate_rps=5.0,
    burst_rate_rps=40.0,
    burst_start_s=60.0,
    burst_duration_s=1800.0,
    nodes_total=8,
    warm_nodes=4,
    calibration_requests=60,
    autoscaling=AutoscalingSpec(enabled=True, min_replicas=1, max_replicas=8),
)


def test_aws_figures_give_tens_of_minutes_vs_seconds() -> None:
    p = WhatIfParams()
    assert p.origin_bytes_per_s == pytest.approx(145e9 / 1200)
    assert p.model_bytes / p.origin_bytes_per_s == pytest.approx(1200.0)  # "20+ min"
    assert p.model_bytes / p.nvme_bytes_per_s == pytest.approx(20.7, abs=0.1)  # 7 GB/s NVMe
    assert p.start_s(False, False) > 25 * 60  # AWS: new capacity after 25-30+ min
    assert p.start_s(True, True) < 90


@pytest.mark.slow
def test_scenarios_order_and_shares() -> None:
    model = calibrate(SMALL)
    assert model.capacity_rps > 0
    assert model.slots >= 1
    cold = run_scenario(SMALL, "cold", model)
    weights = run_scenario(SMALL, "weights", model)
    warm = run_scenario(SMALL, "weights+image", model)
    for r in (cold, weights, warm):
        assert r.burst_requests > 0
        assert r.time_to_capacity_s is not None
    assert cold.time_to_capacity_s > weights.time_to_capacity_s > warm.time_to_capacity_s  # type: ignore[operator]
    assert cold.ttft_p95_ms > weights.ttft_p95_ms >= warm.ttft_p95_ms
    assert cold.unprepared_request_share == 1.0
    assert 0.0 <= warm.unprepared_request_share < 1.0
    assert warm.ttft_p99_ms >= warm.ttft_p95_ms >= warm.ttft_p50_ms


def test_deterministic_for_a_seed() -> None:
    small = SMALL.model_copy(update={"burst_duration_s": 300.0})
    model = calibrate(small)
    assert (
        run_scenario(small, "weights", model).report()
        == run_scenario(small, "weights", model).report()
    )


def test_report_shape() -> None:
    small = SMALL.model_copy(update={"burst_duration_s": 200.0})
    report = run_whatif(small, ("cold", "weights+image"))
    assert set(cast(dict[str, object], report["scenarios"])) == {"cold", "weights+image"}
    assert report["derived"]["replica_start_s"]["cold"] == pytest.approx(1590.0)  # type: ignore[index]


@pytest.mark.slow
def test_routing_is_the_factory_strategy_on_the_simulator_kernel() -> None:
    """The what-if routes with the strategy ``routing.factory`` builds, run by ``sim.Simulator``:
    naming another strategy changes every decision's reason and the outcome (a what-if with an
    event loop and a least-outstanding rule of its own would ignore the name)."""
    small = SMALL.model_copy(update={"burst_duration_s": 300.0})
    model = calibrate(small)
    lor = run_scenario(small, "weights+image", model)
    rr = run_scenario(small, "weights+image", model, routing="round_robin")
    assert set(lor.decisions_by_reason) == {"load_balance"}
    assert set(rr.decisions_by_reason) == {"round_robin"}
    assert sum(lor.decisions_by_reason.values()) == sum(rr.decisions_by_reason.values())
    assert lor.report() != rr.report()
    with pytest.raises(ConfigError, match="unknown strategy"):
        run_scenario(small, "weights", model, routing="nope")


@pytest.mark.parametrize(
    ("field", "value"), [("burstDurationS", 1e9), ("burstStartS", 1e9), ("nodesTotal", 10**6)]
)
def test_a_what_if_that_would_run_without_end_is_refused(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_document(WhatIfParams, {field: value}, "params")
