"""``warmfleet doctor``'s replays (pure): the trace under every strategy on its fleet, the best
strategy's key parameter swept, and with a target the instance count and the KV per instance
that reach it; then the report (``DoctorResult.report``). docs/doctor.md.

The sweeps are bounded: ``len(STRATEGY_NAMES)`` runs, the captured strategy when its parameters
differ from the defaults, ``len(KNOB_VALUES[best])`` for the knob, and at most
``len(SCALE_FACTORS)`` each for instances and KV, stopping at the first that reaches the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from warmfleet.api.trace_format import TraceFile
from warmfleet.core.errors import ConfigError
from warmfleet.core.progress import NoProgress, RunProgress
from warmfleet.core.types import InstanceId, Reason
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.config import STRATEGY_NAMES, StrategyConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.sim import doctor
from warmfleet.sim.metrics import percentile
from warmfleet.sim.placements import captured_placements
from warmfleet.sim.runner import (
    Comparison,
    Prepared,
    StrategyRun,
    prepare,
    run_strategy,
    working_set_blocks_of,
)
from warmfleet.sim.scenario import ScaleEventConfig, ScenarioSpec, build_workload, engine_spec
from warmfleet.sim.trace_fleet import captured_strategy
from warmfleet.sim.workloads.traces import Trace

# each strategy's key parameter and the values tried (the default among them)
KNOB_VALUES: dict[str, tuple[str, tuple[float, ...]]] = {
    "prefix_hash": ("concurrency_threshold", (2, 5, 10, 20, 50)),
    "prefix_affinity": ("load_weight", (0.005, 0.02, 0.1, 0.5)),
    "sglang_cache_aware": ("cache_threshold", (0.1, 0.3, 0.5, 0.7)),
    "llmd_approx": ("prefix_weight", (1.0, 3.0, 6.0, 12.0)),
}
SCALE_FACTORS = (1.5, 2.0, 3.0, 4.0)  # instances / KV per instance tried for a target
TargetMetric = Literal["hit_rate", "p95_ttft_ms"]
JOIN_LEAD_S = 0.001  # a joined instance is added this long before its first request


@dataclass(frozen=True, slots=True)
class Target:
    metric: TargetMetric
    value: float

    def reached(self, run: StrategyRun) -> bool:
        if self.metric == "hit_rate":
            return run.metrics.hit_rate >= self.value
        return p95_ms(run) <= self.value


def parse_target(text: str) -> Target:
    """``hit_rate=0.6`` or ``p95_ttft_ms=800``."""
    name, _, value = text.partition("=")
    name = name.strip()
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if name == "hit_rate" and 0.0 < number <= 1.0:
        return Target("hit_rate", number)
    if name == "p95_ttft_ms" and 0.0 < number < math.inf:
        return Target("p95_ttft_ms", number)
    raise ConfigError(f"--target: hit_rate=F (0 < F <= 1) or p95_ttft_ms=MS, got {text!r}")


def p95_ms(run: StrategyRun) -> float:
    return percentile(run.metrics.ttft_s, 95) * 1000.0


def _figures(run: StrategyRun) -> dict[str, object]:
    ttft_s = run.metrics.ttft_s
    return {
        "hit_rate": run.metrics.hit_rate,
        "ttft_ms": {f"p{p}": percentile(ttft_s, p) * 1000.0 for p in (50, 95, 99)},
        "rejected": run.metrics.rejected - run.metrics.shed,  # not in the figures above
    }


@dataclass(slots=True)
class DoctorResult:
    comparison: Comparison
    trace: TraceFile
    churn: doctor.Churn
    waterfall: dict[str, float | None]
    captured: str | None
    best: str
    knob: dict[str, object] | None = None
    sizing: list[dict[str, object]] = field(default_factory=list)
    target: Target | None = None

    placed: StrategyRun | None = None  # the captured strategy replaying the placements

    def run(self, name: str) -> StrategyRun:
        return comparison_run(self.comparison, name)

    def captured_replay(self) -> tuple[StrategyRun, str] | None:
        """The waterfall's ``captured_replay`` run and how it replayed (``placements`` or
        ``fresh_draw``); None without a captured strategy."""
        if self.placed is not None:
            return self.placed, "placements"
        return None if self.captured is None else (self.run(self.captured), "fresh_draw")

    def report(self) -> dict[str, object]:
        loss = doctor.largest_loss(self.waterfall)
        c = self.comparison
        return {
            "trace": c.workload.source,
            "requests": len(c.workload.requests),
            "block_tokens": c.workload.block_tokens,
            "fleet": {
                "instances": c.scenario.instances,
                "preset": c.scenario.preset,
                "kv_capacity_tokens": c.engine.kv_capacity_tokens,
                "captured_strategy": self.captured,
            },
            "waterfall": dict(self.waterfall),
            "largest_loss": loss.as_report() if loss is not None else None,
            "captured": self._captured_report(),
            "best_strategy": self.best,
            "strategies": {r.name: _figures(r) for r in c.runs},
            "scale_out": self._scale_out(),
            "unprepared": self._unprepared(),
            "recommendations": self._recommendations(),
        }

    def _captured_report(self) -> dict[str, object] | None:
        """How the captured strategy replayed: by the captured placements (the waterfall's
        step when the capture names instances) and by a fresh draw of its own choices."""
        replayed = self.captured_replay()
        if replayed is None:
            return None
        run, how = replayed
        placed = run.metrics.decisions_by_reason.get(str(Reason.REPLAYED), 0)
        return {"strategy": self.captured, "replay": how, **_figures(run),
                "placed_requests": placed, "requests": len(self.comparison.workload.requests),
                "fresh_draw": _figures(self.run(self.captured or ""))}  # fmt: skip

    def _scale_out(self) -> dict[str, object]:
        windows = self.churn.windows()
        out: dict[str, object] = {"windows": len(windows), "reason": self.churn.reason}
        if self.churn.reason is not None:
            return out
        inside = [
            i for i, req in enumerate(self.comparison.workload.requests)
            if doctor.in_windows(self.trace_time_s(req.request_id), windows)
        ]  # fmt: skip
        out["requests"] = len(inside)
        out["live_hit_rate"] = doctor.live_hit_rate_in(self.trace.records, windows)
        out["replay_hit_rate"] = {
            r.name: _hit_rate_of(r, inside, self.comparison) for r in self.comparison.runs
        }
        return out

    def trace_time_s(self, record_index: int) -> float:
        start_ms = min(r.timestamp for r in self.trace.records)
        return (self.trace.records[record_index].timestamp - start_ms) / 1000.0

    def _unprepared(self) -> dict[str, object]:
        share = doctor.unprepared_share(self.trace.records, self.churn)
        reason = None if share is not None else self.churn.reason
        return {"share": share, "window_s": doctor.WARM_WINDOW_S, "reason": reason}

    def _recommendations(self) -> list[dict[str, object]]:
        best = self.run(self.best)
        out: list[dict[str, object]] = [
            {"kind": "strategy", "strategy": self.best, **_figures(best)}
        ]
        if self.knob is not None:
            out.append({"kind": "parameter", "strategy": self.best, **self.knob})
        out.extend(self.sizing)
        return out


def _hit_rate_of(run: StrategyRun, indices: Sequence[int], comparison: Comparison) -> float | None:
    """A run's engine-delivered hit rate over the requests ``indices`` (None: none)."""
    cached = [run.metrics.cached_tokens[i] for i in indices]
    prompt = sum(comparison.workload.requests[i].prompt_tokens for i in indices)
    return sum(cached) / prompt if prompt else None


def replay_scenario(scenario: ScenarioSpec, churn: doctor.Churn) -> ScenarioSpec:
    """The scenario with the capture's scale-outs replayed: an instance added at each join,
    ``JOIN_LEAD_S`` before the first request it served (live, it was routable by then)."""
    adds = tuple(
        ScaleEventConfig(at_s=max(0.0, at_s - JOIN_LEAD_S), action="add")
        for at_s in sorted(churn.joins.values())
    )
    return scenario.model_copy(update={"scale_events": adds}) if adds else scenario


def run_doctor(
    scenario: ScenarioSpec,
    trace: Trace,
    parsed: TraceFile,
    target: Target | None = None,
    progress: RunProgress | None = None,
) -> DoctorResult:
    """Replay ``trace`` (already parsed: ``parsed``) on ``scenario``'s fleet under every
    strategy, then sweep as the module docstring says."""
    progress = progress or NoProgress()
    churn = doctor.churn_of(parsed.records)
    scenario = replay_scenario(scenario, churn)
    comparison, prepared = _prepared(scenario, trace, progress)
    spec, workload = comparison.engine, comparison.workload

    def run(
        name: str,
        config: StrategyConfig | None = None,
        label: str | None = None,
        scen: ScenarioSpec = scenario,
        engine: EngineSpec = spec,
        *,
        placements: Mapping[int, InstanceId] | None = None,
    ) -> StrategyRun:
        return run_strategy(
            name, scen, engine, workload, prepared, progress=progress, config=config,
            label=label, placements=placements,
        )  # fmt: skip

    configs = {name: (name, strategy_config(name)) for name in STRATEGY_NAMES}
    comparison.runs.extend(run(name) for name in STRATEGY_NAMES)
    captured, captured_name, placed = _captured_runs(comparison, parsed, churn, run)
    if captured is not None and captured_name is not None:
        configs[captured_name] = captured
    ideal, ceiling = doctor.reuse_bounds(prepared, spec.capacity_blocks * scenario.instances)
    best = max(comparison.runs, key=lambda r: (r.metrics.hit_rate, -p95_ms(r)))
    chosen = Chosen(best, *configs[best.name])
    fresh = None if captured_name is None else comparison_run(comparison, captured_name)
    replayed = placed or fresh
    waterfall: dict[str, float | None] = {
        "ideal": ideal,
        "fleet_ceiling": ceiling,
        "best_replay": best.metrics.hit_rate,
        "captured_replay": None if replayed is None else replayed.metrics.hit_rate,
        "delivered": doctor.delivered(parsed.records),
    }
    result = DoctorResult(comparison, parsed, churn, waterfall, captured_name, best.name)
    result.placed = placed
    result.knob = sweep_knob(chosen, run)
    if target is not None:
        result.target = target
        result.sizing = _sizing(
            target, best=chosen, scenario=scenario, spec=spec, run=run, ideal=ideal
        )
    return result


def _prepared(
    scenario: ScenarioSpec, trace: Trace, progress: RunProgress
) -> tuple[Comparison, Prepared]:
    """The trace's workload on ``scenario``'s engines, hashed, and an empty comparison."""
    spec = engine_spec(scenario)
    workload = build_workload(scenario, spec, trace=trace)
    spec = spec.with_block_tokens(workload.block_tokens)
    progress.phase("hashing the trace's blocks", len(workload.requests))
    prepared = prepare(workload.requests, workload.block_tokens, progress)
    ratio = working_set_blocks_of(prepared) / max(spec.capacity_blocks, 1)
    return Comparison(scenario, spec, workload, ratio), prepared


def comparison_run(comparison: Comparison, name: str) -> StrategyRun:
    return next(r for r in comparison.runs if r.name == name)


RunFn = Callable[..., StrategyRun]


def _captured_run(
    comparison: Comparison, captured: tuple[str, StrategyConfig] | None, run: RunFn
) -> str | None:
    """The run of the captured strategy: the default run when its parameters are the
    defaults, else a run of its own, ``NAME (captured)``."""
    if captured is None:
        return None
    name, config = captured
    if config == strategy_config(name):
        return name
    label = f"{name} (captured)"
    comparison.runs.append(run(name, config, label))
    return label


def _captured_runs(
    comparison: Comparison, parsed: TraceFile, churn: doctor.Churn, run: RunFn
) -> tuple[tuple[str, StrategyConfig] | None, str | None, StrategyRun | None]:
    """The captured strategy (name and configuration), the name of its run (a fresh draw of
    its choices), and, when the capture names instances, its run replaying the captured
    placements (``sim.placements``)."""
    captured = captured_strategy(parsed.header)
    name = _captured_run(comparison, captured, run)
    placements = captured_placements(
        parsed.records, comparison.workload.requests, comparison.scenario.instances, churn.joins
    )
    if captured is None or placements is None:
        return captured, name, None
    return captured, name, run(*captured, f"{name} (placements)", placements=placements)


@dataclass(frozen=True, slots=True)
class Chosen:
    """The best replay, its strategy's name and its configuration."""

    run: StrategyRun
    name: str
    config: StrategyConfig


def sweep_knob(best: Chosen, run: RunFn) -> dict[str, object] | None:
    """The best strategy's key parameter over ``KNOB_VALUES`` (its other parameters kept):
    each value's replayed figures and the value to set (the highest hit rate, then the lowest
    P95 TTFT); ``default`` is the value the best replay ran with."""
    name = best.name
    if name not in KNOB_VALUES:
        return None
    knob, values = KNOB_VALUES[name]
    default = getattr(best.config, knob)
    params = best.config.model_dump(exclude={"type"})
    sweep: list[tuple[float, StrategyRun]] = [(default, best.run)]
    for value in values:
        if value != default:
            config = strategy_config(name, **{**params, knob: value})
            sweep.append((value, run(name, config, f"{best.run.name} {knob}={value:g}")))
    sweep.sort(key=lambda vr: vr[0])
    value, chosen = max(sweep, key=lambda vr: (vr[1].metrics.hit_rate, -p95_ms(vr[1])))
    return {
        "parameter": knob,
        "value": value,
        "default": default,
        **_figures(chosen),
        "sweep": [{"value": v, **_figures(r)} for v, r in sweep],
    }


def _sizing(
    target: Target,
    *,
    best: Chosen,
    scenario: ScenarioSpec,
    spec: EngineSpec,
    run: RunFn,
    ideal: float,
) -> list[dict[str, object]]:
    """The instance count, then the KV per instance, that reach ``target`` with the best
    strategy (first of ``SCALE_FACTORS`` that does; ``reached`` false past the last). A hit
    rate above the trace's ideal reuse is reached by no fleet: said, and nothing run."""
    out: list[dict[str, object]] = []
    if target.reached(best.run):
        return [{"kind": "target", "reached_now": True, **_figures(best.run), **_goal(target)}]
    if target.metric == "hit_rate" and target.value > ideal:
        reason = f"above the trace's ideal reuse ({ideal:.3f}): no fleet reaches it"
        return [{"kind": "target", "reached_now": False, "reason": reason, **_goal(target)}]

    def instances(factor: float) -> tuple[int, StrategyRun]:
        count = math.ceil(scenario.instances * factor)
        bigger = scenario.model_copy(update={"instances": count})
        label = f"{best.run.name} x{count} instances"
        return count, run(best.name, best.config, label, bigger, spec)

    def kv_per_instance(factor: float) -> tuple[int, StrategyRun]:
        kv_tokens = math.ceil(spec.kv_capacity_tokens * factor)
        engine = spec.model_copy(update={"kv_capacity_tokens": kv_tokens})
        label = f"{best.run.name} kv x{factor:g}"
        return kv_tokens, run(best.name, best.config, label, scenario, engine)

    out.append(_sweep(target, "instances", "instances", instances))
    out.append(_sweep(target, "kv_per_instance", "kv_capacity_tokens", kv_per_instance))
    return out


def _sweep(
    target: Target, kind: str, knob: str, step: Callable[[float], tuple[int, StrategyRun]]
) -> dict[str, object]:
    """``step`` at each of ``SCALE_FACTORS`` until the target is reached (or they run out)."""
    tried: list[dict[str, object]] = []
    for factor in SCALE_FACTORS:
        value, result = step(factor)
        tried.append({knob: value, **_figures(result)})
        if target.reached(result):
            break
    return {"kind": kind, **_goal(target), "reached": target.reached(result), knob: value,
            "sweep": tried}  # fmt: skip


def _goal(target: Target) -> dict[str, object]:
    return {"target": {target.metric: target.value}}
