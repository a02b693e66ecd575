"""``warmfleet doctor``'s sweeps (pure): which replay is best for an objective (``best_of``), the
best strategy's key parameter and, with a target, the instance count and the KV per instance
that reach it. ``run_doctor`` (``doctor_run``) calls them with its ``RunFn``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from warmfleet.core.errors import ConfigError
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.config import StrategyConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.sim.metrics import percentile
from warmfleet.sim.runner import StrategyRun
from warmfleet.sim.scenario import ScenarioSpec

# each strategy's key parameter and the values tried (the default among them)
KNOB_VALUES: dict[str, tuple[str, tuple[float, ...]]] = {
    "prefix_hash": ("concurrency_threshold", (2, 5, 10, 20, 50)),
    "prefix_affinity": ("load_weight", (0.005, 0.02, 0.1, 0.5)),
    "sglang_cache_aware": ("cache_threshold", (0.1, 0.3, 0.5, 0.7)),
    "llmd_approx": ("prefix_weight", (1.0, 3.0, 6.0, 12.0)),
}
SCALE_FACTORS = (1.5, 2.0, 3.0, 4.0)  # instances / KV per instance tried for a target
TargetMetric = Literal["hit_rate", "p95_ttft_ms"]
# What "best" means for the recommendations: the highest hit rate, or the lowest P95 TTFT
Objective = TargetMetric
OBJECTIVES: tuple[Objective, ...] = ("p95_ttft_ms", "hit_rate")
# P95 TTFTs within this fraction of the lowest are a tie, which the higher hit rate breaks: a
# tail 1 % shorter is not worth reuse given up (a judgment; a replay of a trace is deterministic)
P95_TIE_FRAC = 0.01
# Hit rates this close are a tie too (a tenth of a point): with the P95s tied, the strategy the
# capture ran is kept (``best_of``'s ``prefer``): a recommendation to change needs a difference
HIT_TIE = 0.001


@dataclass(frozen=True, slots=True)
class Target:
    metric: TargetMetric
    value: float

    def reached(self, run: StrategyRun) -> bool:
        if self.metric == "hit_rate":
            return run.metrics.hit_rate >= self.value
        return p95_ms(run) <= self.value


def best_of(
    runs: Sequence[StrategyRun], objective: Objective, prefer: str | None = None
) -> StrategyRun:
    """The best of ``runs`` (not empty) for ``objective``: the highest hit rate (ties: the lower
    P95 TTFT), or the lowest P95 TTFT (within ``P95_TIE_FRAC``: the higher hit rate). The run
    named ``prefer`` (the captured strategy) wins when it ties the best (hit rate within
    ``HIT_TIE``, P95 within ``P95_TIE_FRAC``); else the first of equals."""
    if objective == "p95_ttft_ms":
        bound_ms = min(p95_ms(r) for r in runs) * (1.0 + P95_TIE_FRAC)
        runs = [r for r in runs if p95_ms(r) <= bound_ms]
    best = max(runs, key=lambda r: (r.metrics.hit_rate, -p95_ms(r)))
    for run in runs:
        if (
            run.name == prefer
            and run.metrics.hit_rate >= best.metrics.hit_rate - HIT_TIE
            and p95_ms(run) <= p95_ms(best) * (1.0 + P95_TIE_FRAC)
        ):
            return run
    return best


def objective_for(target: Target | None) -> Objective:
    """The objective when none is given: the target's metric, else the lowest P95 TTFT (what
    the fleet's users feel; a higher hit rate that queues more is not better)."""
    return "p95_ttft_ms" if target is None else target.metric


def parse_objective(text: str) -> Objective:
    for objective in OBJECTIVES:
        if text == objective:
            return objective
    raise ConfigError(f"--objective: one of {', '.join(OBJECTIVES)}, got {text!r}")


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


def figures(run: StrategyRun) -> dict[str, object]:
    ttft_s = run.metrics.ttft_s
    return {
        "hit_rate": run.metrics.hit_rate,
        "ttft_ms": {f"p{p}": percentile(ttft_s, p) * 1000.0 for p in (50, 95, 99)},
        "rejected": run.metrics.rejected - run.metrics.shed,  # not in the figures above
    }


RunFn = Callable[..., StrategyRun]


@dataclass(frozen=True, slots=True)
class Chosen:
    """The best replay, its strategy's name and its configuration."""

    run: StrategyRun
    name: str
    config: StrategyConfig


def sweep_knob(best: Chosen, run: RunFn, objective: Objective) -> dict[str, object] | None:
    """The best strategy's key parameter over ``KNOB_VALUES`` (its other parameters kept):
    each value's replayed figures and the value to set (the best for ``objective``,
    ``best_of``; the default when none is better); ``default`` is the value the best replay
    ran with."""
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
    # the default first: a value no better than it (a tie) is not worth changing the setting
    chosen = best_of([best.run, *(r for _, r in sweep if r is not best.run)], objective)
    value = next(v for v, r in sweep if r is chosen)
    return {
        "parameter": knob,
        "value": value,
        "default": default,
        **figures(chosen),
        "sweep": [{"value": v, **figures(r)} for v, r in sweep],
    }


def sizing(
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
        return [{"kind": "target", "reached_now": True, **figures(best.run), **_goal(target)}]
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
        tried.append({knob: value, **figures(result)})
        if target.reached(result):
            break
    return {"kind": kind, **_goal(target), "reached": target.reached(result), knob: value,
            "sweep": tried}  # fmt: skip


def _goal(target: Target) -> dict[str, object]:
    return {"target": {target.metric: target.value}}
