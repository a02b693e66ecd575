"""``make bench-flow``: flow control's acceptance figures (issue 23) in the one simulator.

Three experiments on 8 x ``llama-3.1-70b-p5`` (docs/benchmarks.md, docs/flow-control.md):

* noisy neighbour: a victim tenant's conversations alone, then with a second tenant bursting to
  3x the fleet's measured capacity for a minute, without and with flow control;
* priorities: two bands under 2x overload, each with a TTFT objective;
* wait-vs-spill: the AWS long-context scenario at saturation, ``prefix_hash`` (AWS's spill at
  its concurrency threshold) beside ``prefix_affinity`` with an instance cap that spills at
  once, that waits or spills by predicted cost, and with no cap at all.

Every run reports whether its requests were conserved (each served, refused or shed once).

    python -m warmfleet.bench.flow_bench --out bench-results/flow.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from warmfleet.bench.flow_scenarios import (
    Run,
    cold_stream,
    conversations,
    hit_rate,
    merged,
    p_ttft_ms,
    shed_count,
    simulate,
    slo_attainment,
)
from warmfleet.engine.presets import get_preset
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.config import PrefixAffinityConfig
from warmfleet.routing.flow_config import FlowControlConfig
from warmfleet.sim.runner import prepare_comparison, run_strategy
from warmfleet.sim.scenario import builtin_scenario
from warmfleet.sim.workloads.base import WorkloadRequest

PRESET = "llama-3.1-70b-p5"
INSTANCES = 8
BURST_START_S, BURST_S = 50.0, 60.0
COLD_PROMPT_TOKENS, COLD_OUTPUT_TOKENS = 3000, 100
SLO_MS = 1000.0
WAIT_VS_SPILL_RATE_RPS = 40.0
WAIT_VS_SPILL_CAP = 64
# the worked example of docs/flow-control.md
FLOW = FlowControlConfig.model_validate({"maxInFlightPerInstance": 64, "maxPendingPrefillMs": 150})


def fleet_capacity_rps(spec: EngineSpec, seed: int) -> float:
    """Requests per second the fleet serves of the burst's shape: an overload of them (2x a
    prefill-bound estimate for 20 s) divided by the time to serve them all."""
    estimate_rps = INSTANCES / spec.prefill_s(COLD_PROMPT_TOKENS)
    burst = cold_stream(
        "capacity", seed, rate_rps=2 * estimate_rps, start_s=0.0, duration_s=20.0,
        prompt_tokens=COLD_PROMPT_TOKENS, output_tokens=COLD_OUTPUT_TOKENS,
    )  # fmt: skip
    run = simulate(merged(burst), spec, INSTANCES, PrefixAffinityConfig(), seed=seed)
    span_s = max(r.finish_s for r in run.records) - min(r.arrival_s for r in run.records)
    return len(run.records) / span_s


def noisy_neighbour(spec: EngineSpec, capacity_rps: float, seed: int) -> dict[str, Any]:
    victim = conversations("victim", seed, users=40, rounds=8, qps=2.0)
    burst = cold_stream(
        "burst", seed, rate_rps=3 * capacity_rps, start_s=BURST_START_S, duration_s=BURST_S,
        prompt_tokens=COLD_PROMPT_TOKENS, output_tokens=COLD_OUTPUT_TOKENS,
    )  # fmt: skip
    runs = {
        "alone": simulate(merged(victim), spec, INSTANCES, PrefixAffinityConfig(), seed=seed),
        "burst_no_fc": simulate(
            merged(victim, burst), spec, INSTANCES, PrefixAffinityConfig(), seed=seed
        ),
        "burst_fc": simulate(
            merged(victim, burst), spec, INSTANCES, PrefixAffinityConfig(), seed=seed, flow=FLOW
        ),
    }

    def is_victim(r: Any) -> bool:
        return bool(r.tenant == "victim")

    def in_burst(r: Any) -> bool:
        return is_victim(r) and BURST_START_S <= r.arrival_s < BURST_START_S + BURST_S

    return {
        "victim_p99_ttft_ms": {name: p_ttft_ms(run, is_victim, 99) for name, run in runs.items()},
        "victim_hit_rate": {
            "alone": hit_rate(runs["alone"], in_burst),
            "burst_no_fc": hit_rate(runs["burst_no_fc"], in_burst),
            "burst_fc": hit_rate(runs["burst_fc"], in_burst),
        },
        "noisy_neighbour": {
            "burst_rate_rps": round(3 * capacity_rps, 2),
            "victim_requests": sum(map(is_victim, runs["alone"].requests)),
            "burst_requests": len(burst),
            "victim_shed": {n: shed_count(r, is_victim) for n, r in runs.items()},
            "burst_shed": shed_count(runs["burst_fc"], lambda r: r.tenant == "burst"),
            "conserved": {n: r.conserved for n, r in runs.items()},
        },
    }


def priorities(spec: EngineSpec, capacity_rps: float, seed: int) -> dict[str, Any]:
    """High band at 0.8x capacity, low band at 1.2x (2x in all), both with a 1 s TTFT SLO."""

    def stream(tenant: str, share: float, priority: int) -> list[WorkloadRequest]:
        return cold_stream(
            tenant, seed, rate_rps=share * capacity_rps, start_s=0.0, duration_s=60.0,
            prompt_tokens=COLD_PROMPT_TOKENS, output_tokens=COLD_OUTPUT_TOKENS,
            priority=priority,
        )  # fmt: skip

    high = stream("high", 0.8, 1)
    low = stream("low", 1.2, -1)
    bands = [
        {"name": "high", "minPriority": 0, "ttftSloMs": SLO_MS},
        {"name": "low", "minPriority": -1000, "ttftSloMs": SLO_MS},
    ]
    flow = FlowControlConfig.model_validate({**FLOW.model_dump(by_alias=True), "bands": bands})
    requests = merged(high, low)
    runs: dict[str, Run] = {
        "no_fc": simulate(requests, spec, INSTANCES, PrefixAffinityConfig(), seed=seed),
        "fc": simulate(requests, spec, INSTANCES, PrefixAffinityConfig(), seed=seed, flow=flow),
    }

    def band(name: str) -> Any:
        return lambda r: r.tenant == name

    fc = runs["fc"]
    return {
        "slo_attainment": {b: slo_attainment(fc, band(b), SLO_MS / 1000) for b in ("high", "low")},
        "shed": {b: shed_count(fc, band(b)) for b in ("high", "low")},
        "priorities": {
            "ttft_slo_ms": SLO_MS,
            "requests": {b: sum(map(band(b), requests)) for b in ("high", "low")},
            "slo_attainment_no_fc": {
                b: slo_attainment(runs["no_fc"], band(b), SLO_MS / 1000) for b in ("high", "low")
            },
            "conserved": {n: r.conserved for n, r in runs.items()},
        },
    }


def wait_vs_spill(seed: int) -> dict[str, Any]:
    scenario = builtin_scenario("aws-long-context", INSTANCES, PRESET, seed)
    comparison, prepared = prepare_comparison(scenario, rate_rps=WAIT_VS_SPILL_RATE_RPS)
    capped = FlowControlConfig(max_in_flight_per_instance=WAIT_VS_SPILL_CAP)
    rows = {
        "prefix_hash": ("prefix_hash", None),
        "prefix_affinity_spill": ("prefix_affinity", capped.model_copy(update={"spill": "always"})),
        "prefix_affinity_queue": ("prefix_affinity", capped),
        "prefix_affinity_uncapped": ("prefix_affinity", None),
    }
    out: dict[str, Any] = {
        "scenario": "aws-long-context",
        "rate_rps": WAIT_VS_SPILL_RATE_RPS,
        "max_in_flight_per_instance": WAIT_VS_SPILL_CAP,
        "requests": len(prepared.requests),
    }
    for label, (name, flow) in rows.items():
        run = run_strategy(
            name, comparison.scenario, comparison.engine, comparison.workload, prepared,
            flow=flow, label=label,
        )  # fmt: skip
        report = run.metrics.as_report()
        out[label] = {
            "p90_ttft_ms": round(report["ttft_ms"]["p90"], 1),  # type: ignore[index]
            "hit_rate": round(run.metrics.hit_rate, 4),
            "shed": run.metrics.shed,
            "decisions_by_reason": run.metrics.decisions_by_reason,
            "conserved": run.conserved,
        }
    return out


def acceptance(report: dict[str, Any]) -> dict[str, bool]:
    p99 = report["victim_p99_ttft_ms"]
    hits = report["victim_hit_rate"]
    wvs = report["wait_vs_spill"]
    queue = wvs["prefix_affinity_queue"]
    conserved = [*report["noisy_neighbour"]["conserved"].values()]
    conserved += [*report["priorities"]["conserved"].values()]
    conserved += [wvs[k]["conserved"] for k in wvs if isinstance(wvs[k], dict)]
    return {
        "victim_p99_within_1_5x_alone": p99["burst_fc"] <= 1.5 * p99["alone"],
        "victim_hit_rate_at_least_0_9x_alone": hits["burst_fc"] >= 0.9 * hits["alone"],
        "high_band_slo_attainment_at_least_0_95": report["slo_attainment"]["high"] >= 0.95,
        "low_band_absorbs_shedding": report["shed"]["low"] > report["shed"]["high"],
        "queue_beats_spill_p90_and_hit_rate": all(
            queue["p90_ttft_ms"] < wvs[other]["p90_ttft_ms"]
            and queue["hit_rate"] > wvs[other]["hit_rate"]
            for other in ("prefix_hash", "prefix_affinity_spill")
        ),
        "every_run_conserved": all(conserved),
    }


def flow_bench_command(
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("bench-results/flow.json"),
    seed: Annotated[int, typer.Option(help="seed of the workloads")] = 1,
) -> None:
    """Run the three experiments and write their figures and acceptance checks to ``out``."""
    spec = get_preset(PRESET)
    capacity_rps = fleet_capacity_rps(spec, seed)
    report: dict[str, Any] = {
        "preset": PRESET,
        "instances": INSTANCES,
        "seed": seed,
        "fleet_capacity_rps": round(capacity_rps, 2),
        "flow_config": FLOW.model_dump(by_alias=True, exclude_defaults=True),
    }
    report.update(noisy_neighbour(spec, capacity_rps, seed))
    report.update(priorities(spec, capacity_rps, seed))
    report["wait_vs_spill"] = wait_vs_spill(seed)
    report["acceptance"] = acceptance(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    typer.echo(json.dumps(report["acceptance"], indent=2))


def main() -> None:
    typer.run(flow_bench_command)


if __name__ == "__main__":
    main()
