"""Flow control in the one simulator (issue 23): queued and shed requests are conserved, a
request with an unmeetable deadline is shed, requests are held while no instance is ready, and
``warmfleet sim --trace --flow`` acts on a trace's ``tenant``/``priority``/``deadline_ms``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from warmfleet.bench import sim_cli
from warmfleet.bench.flow_scenarios import cold_stream, merged, simulate
from warmfleet.engine.presets import get_preset
from warmfleet.flow.gate import FlowGate
from warmfleet.flow.model import TtftPredictor
from warmfleet.routing.config import PrefixAffinityConfig
from warmfleet.routing.factory import build_strategy
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.sim.fleet import FleetView, Join
from warmfleet.sim.runner import prepare, routing_keys, strategy_rng
from warmfleet.sim.simulator import SimConfig, Simulator
from warmfleet.sim.workloads.base import WorkloadRequest

SPEC = get_preset("tiny-cpu")


def _overload(deadline_ms: float | None = None) -> tuple[WorkloadRequest, ...]:
    hi = cold_stream(
        "a", 1, rate_rps=40, start_s=0, duration_s=3, prompt_tokens=300, output_tokens=20,
        priority=1, deadline_ms=deadline_ms,
    )  # fmt: skip
    lo = cold_stream(
        "b", 1, rate_rps=40, start_s=0, duration_s=3, prompt_tokens=300, output_tokens=20,
        priority=-1,
    )  # fmt: skip
    return merged(hi, lo)


def test_queued_and_shed_requests_are_conserved_and_low_band_sheds_first() -> None:
    flow = FlowControlConfig(max_in_flight_per_instance=2, max_queued_requests=8)
    run = simulate(_overload(), SPEC, 2, PrefixAffinityConfig(), seed=1, flow=flow)
    assert run.conserved
    pairs = zip(run.requests, run.records, strict=True)
    shed = [(req.tenant, rec.shed_status) for req, rec in pairs if rec.shed_status]
    assert shed  # the overload is real
    assert {status for _, status in shed} == {429}
    assert sum(t == "b" for t, _ in shed) > sum(t == "a" for t, _ in shed)
    reasons = {rec.reason for rec in run.records}
    assert "queued" in reasons
    assert all(rec.done for rec in run.records)
    served = [rec for rec in run.records if not rec.rejected]
    assert all(rec.first_token_s >= rec.arrival_s + rec.queued_s - 1e-9 for rec in served)


def test_unmeetable_deadlines_are_shed_before_they_expire() -> None:
    flow = FlowControlConfig(max_in_flight_per_instance=1, max_queued_requests=64)
    run = simulate(_overload(deadline_ms=50), SPEC, 1, PrefixAffinityConfig(), seed=1, flow=flow)
    assert run.conserved
    late = [rec for req, rec in zip(run.requests, run.records, strict=True)
            if req.tenant == "a" and rec.reason == "deadline"]  # fmt: skip
    assert late
    assert all(rec.finish_s < rec.arrival_s + 0.05 for rec in late)


class _OneLater:
    period_s = 1.0
    until_s = 10.0

    def __init__(self) -> None:
        self.started = False

    def tick(self, fleet: FleetView) -> list[Join]:
        assert fleet.in_flight_requests >= 0
        if self.started:
            return []
        self.started = True
        return [Join(2.0, "late")]


def test_requests_wait_in_the_gate_while_no_instance_is_ready() -> None:
    requests = merged(cold_stream("a", 1, rate_rps=5, start_s=0, duration_s=1,
                                  prompt_tokens=100, output_tokens=5))  # fmt: skip
    prepared = prepare(requests, SPEC.block_tokens)
    keys = routing_keys(prepared, 4096)
    strategy = build_strategy(PrefixAffinityConfig(), strategy_rng(1, "prefix_affinity"))
    gate = FlowGate(FlowControlConfig(max_wait_ms=60_000), strategy.choose, TtftPredictor(SPEC))
    result = Simulator(
        SimConfig(instances=0, engine=SPEC), strategy, requests, keys,
        controller=_OneLater(), flow=gate,
    ).run()  # fmt: skip
    assert all(r.done and not r.rejected for r in result.records)
    assert all(r.first_token_s >= 2.0 for r in result.records)
    assert gate.demand() == 0


def test_sim_trace_with_flow_reads_priority_and_deadline(tmp_path: Path) -> None:
    header = ('{"warmfleet_trace": 1, "block_tokens": 16, "fleet": {"instances": 1, '
              '"preset": "tiny-cpu", "kv_capacity_tokens": 4096}}')  # fmt: skip
    lines = [header]
    for i in range(30):
        record = {
            "timestamp": i,
            "input_length": 200,
            "output_length": 20,
            "hash_ids": [1000 + i],
            "tenant": "t",
            "priority": -1 if i % 2 else 1,
        }
        if i % 3 == 0:
            record["deadline_ms"] = 1
        lines.append(json.dumps(record))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flow = tmp_path / "flow.yaml"
    flow.write_text("maxInFlightPerInstance: 1\nmaxQueuedRequests: 4\n", encoding="utf-8")
    app = typer.Typer()
    sim_cli.register(app)
    args = ["sim", "--trace", str(trace), "--strategies", "prefix_affinity", "--flow", str(flow)]
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    requests = doc["strategies"]["prefix_affinity"]["requests"]
    assert requests["submitted"] == 30
    assert requests["shed"] > 0
    assert requests["completed"] + requests["rejected"] == 30
    assert requests["shed_deadline"] > 0  # the 1 ms deadlines cannot be met
    assert "queued" in doc["strategies"]["prefix_affinity"]["decisions_by_reason"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("maxInFlight: 1\n", encoding="utf-8")
    result = CliRunner().invoke(app, [*args[:-1], str(bad)])
    assert result.exit_code == 2
    assert "maxInFlight" in result.output
