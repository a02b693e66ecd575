"""``warmfleet doctor``'s replays (pure): the trace under every strategy on its fleet (as many
gateway replicas as asked; each request's key with its session when the trace records
sessions, as the live gateway's keys had), the best strategy's key parameter swept, and with a
target the instance count and the KV per instance that reach it; then the report
(``DoctorResult.report``). docs/doctor.md.

The sweeps are bounded: ``len(STRATEGY_NAMES)`` runs, the captured strategy when its parameters
differ from the defaults, ``prefix_affinity`` with ``session_placement: hash`` when the trace
has sessions, ``len(KNOB_VALUES[best])`` for the knob, and at most
``len(SCALE_FACTORS)`` each for instances and KV, stopping at the first that reaches the target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from warmfleet.api.trace_format import TraceFile
from warmfleet.core.progress import NoProgress, RunProgress
from warmfleet.core.types import InstanceId, Reason
from warmfleet.engine.spec import EngineSpec
from warmfleet.routing.config import STRATEGY_NAMES, StrategyConfig
from warmfleet.routing.factory import strategy_config
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.sim import doctor
from warmfleet.sim.doctor_sweeps import (
    Chosen,
    Objective,
    RunFn,
    Target,
    best_of,
    figures,
    objective_for,
    sizing,
    sweep_knob,
)
from warmfleet.sim.doctor_sync import HitReuse, SyncTraffic, hit_reuse, sync_traffic
from warmfleet.sim.gateways import GatewaySync
from warmfleet.sim.placements import captured_placements
from warmfleet.sim.runner import (
    Comparison,
    Prepared,
    StrategyRun,
    prepare,
    routing_keys,
    run_strategy,
    working_set_blocks_of,
)
from warmfleet.sim.scenario import ScaleEventConfig, ScenarioSpec, build_workload, engine_spec
from warmfleet.sim.trace_fleet import captured_strategy
from warmfleet.sim.workloads.traces import Trace

JOIN_LEAD_S = 0.001  # a joined instance is added this long before its first request
# replayed beside the strategies when the trace has sessions
SESSION_HASH_RUN = "prefix_affinity session_placement=hash"


@dataclass(slots=True)
class DoctorResult:
    comparison: Comparison
    trace: TraceFile
    churn: doctor.Churn
    waterfall: dict[str, float | None]
    captured: str | None
    best: str  # the recommended replay's name: the best for ``objective``
    objective: Objective
    best_reuse: str  # the waterfall's ``best_replay``: the highest hit rate's name
    sync: SyncTraffic  # the replica-sync notes' traffic behind the replicas
    knob: dict[str, object] | None = None
    sizing: list[dict[str, object]] = field(default_factory=list)
    target: Target | None = None
    gateways: GatewaySync | None = None  # None: one gateway
    sessions: int = 0  # the trace's sessions (its requests' keys carried them)

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
                "gateway_replicas": 1 if self.gateways is None else self.gateways.replicas,
                "sync_delay_ms": self._sync_delay_ms(),
                "kv_events_delay_ms": c.scenario.kv_events_delay_ms,  # None: no KV events
            },
            "sessions": self.sessions,
            "replica_sync": self.sync.report(),
            "waterfall": dict(self.waterfall),
            "largest_loss": loss.as_report() if loss is not None else None,
            "captured": self._captured_report(),
            "objective": self.objective,
            "best_strategy": self.best,
            "best_replay_strategy": self.best_reuse,
            "strategies": {r.name: figures(r) for r in c.runs},
            "scale_out": self._scale_out(),
            "unprepared": self._unprepared(),
            "recommendations": self._recommendations(),
        }

    def _sync_delay_ms(self) -> float | None:
        """The replicas' sync delay (0 with one gateway; None: replicas without sync)."""
        if self.gateways is None:
            return 0.0
        delay_s = self.gateways.sync_delay_s
        return None if delay_s is None else delay_s * 1000.0

    def _captured_report(self) -> dict[str, object] | None:
        """How the captured strategy replayed: by the captured placements (the waterfall's
        step when the capture names instances) and by a fresh draw of its own choices."""
        replayed = self.captured_replay()
        if replayed is None:
            return None
        run, how = replayed
        placed = run.metrics.decisions_by_reason.get(str(Reason.REPLAYED), 0)
        return {"strategy": self.captured, "replay": how, **figures(run),
                "placed_requests": placed, "requests": len(self.comparison.workload.requests),
                "fresh_draw": figures(self.run(self.captured or ""))}  # fmt: skip

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
            {"kind": "strategy", "strategy": self.best, "objective": self.objective,
             "captured": self.best == self.captured, **figures(best)}
        ]  # fmt: skip
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
    *,
    gateways: GatewaySync | None = None,
    objective: Objective | None = None,
) -> DoctorResult:
    """Replay ``trace`` (already parsed: ``parsed``) on ``scenario``'s fleet under every
    strategy, then sweep as the module docstring says; ``gateways``: the replicas every run
    but the captured placements' has (None: one gateway). The recommended strategy, its knob's
    value and the sizing's strategy are the best for ``objective`` (None: ``objective_for``)."""
    objective = objective or objective_for(target)
    progress = progress or NoProgress()
    churn = doctor.churn_of(parsed.records)
    sessions = doctor.session_count(parsed.records)
    scenario = replay_scenario(scenario, churn).model_copy(update={"sessions": sessions > 0})
    comparison, prepared = _prepared(scenario, trace, parsed, progress)
    spec = comparison.engine
    run = _replayer(comparison, prepared, progress, gateways)
    configs = _strategy_configs(sessions)
    comparison.runs.extend(run(name, config, label) for label, (name, config) in configs.items())
    captured, captured_name, placed = _captured_runs(comparison, parsed, churn, run)
    if captured is not None and captured_name is not None:
        configs[captured_name] = captured
    ideal, ceiling = doctor.reuse_bounds(prepared, spec.capacity_blocks * scenario.instances)
    reuse = best_of(comparison.runs, "hit_rate")
    best = best_of(comparison.runs, objective, prefer=captured_name)
    chosen = Chosen(best, *configs[best.name])
    fresh = None if captured_name is None else comparison_run(comparison, captured_name)
    replayed = placed or fresh
    waterfall: dict[str, float | None] = {
        "ideal": ideal, "fleet_ceiling": ceiling, "best_replay": reuse.metrics.hit_rate,
        "captured_replay": None if replayed is None else replayed.metrics.hit_rate,
        "delivered": doctor.delivered(parsed.records),
    }  # fmt: skip
    result = DoctorResult(
        comparison, parsed, churn, waterfall, captured_name, best.name,
        gateways=gateways, sessions=sessions, placed=placed, objective=objective,
        best_reuse=reuse.name, sync=_sync_traffic(prepared, sessions, gateways, best),
    )  # fmt: skip
    result.knob = sweep_knob(chosen, run, objective)
    if target is not None:
        result.target = target
        result.sizing = sizing(
            target, best=chosen, scenario=scenario, spec=spec, run=run, ideal=ideal
        )
    return result


def _replayer(
    comparison: Comparison,
    prepared: Prepared,
    progress: RunProgress,
    gateways: GatewaySync | None,
) -> RunFn:
    """The doctor's ``RunFn``: one replay of the trace, on the comparison's fleet unless told
    otherwise; every run but the captured placements' behind ``gateways``."""
    scenario, spec, workload = comparison.scenario, comparison.engine, comparison.workload

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
            label=label, placements=placements, gateways=None if placements else gateways,
        )  # fmt: skip

    return run


def _strategy_configs(sessions: int) -> dict[str, tuple[str, StrategyConfig]]:
    """Every strategy with its defaults, by run name; with sessions in the trace,
    ``prefix_affinity`` placing them by hash too (replicas without sync, docs/routing.md)."""
    configs = {name: (name, strategy_config(name)) for name in STRATEGY_NAMES}
    if sessions:
        hashed = strategy_config("prefix_affinity", session_placement="hash")
        configs[SESSION_HASH_RUN] = ("prefix_affinity", hashed)
    return configs


def _sync_traffic(
    prepared: Prepared, sessions: int, gateways: GatewaySync | None, best: StrategyRun
) -> SyncTraffic:
    """The replica-sync notes' traffic behind ``gateways`` (``sim.doctor_sync``)."""
    return sync_traffic(
        prepared.requests,
        routing_keys(prepared, DEFAULT_PREFIX_LENGTH, sessions=sessions > 0),
        1 if gateways is None else gateways.replicas,
        reuse=_hit_reuse(prepared, best),
    )


def _hit_reuse(prepared: Prepared, run: StrategyRun) -> HitReuse:
    """The reuse gaps of ``run``'s cache hits (``sim.doctor_sync.hit_reuse``)."""
    arrivals_s = [r.arrival_s for r in prepared.requests]
    metrics = run.metrics
    return hit_reuse(
        arrivals_s, prepared.block_hashes, prepared.block_tokens,
        metrics.cached_tokens, metrics.instances,
    )  # fmt: skip


def _prepared(
    scenario: ScenarioSpec, trace: Trace, parsed: TraceFile, progress: RunProgress
) -> tuple[Comparison, Prepared]:
    """The trace's workload (its records: ``parsed``) on ``scenario``'s engines, hashed, and
    an empty comparison."""
    spec = engine_spec(scenario)
    workload = build_workload(scenario, spec, trace=trace, parsed=parsed)
    spec = spec.with_block_tokens(workload.block_tokens)
    progress.phase("hashing the trace's blocks", len(workload.requests))
    prepared = prepare(workload.requests, workload.block_tokens, progress)
    ratio = working_set_blocks_of(prepared) / max(spec.capacity_blocks, 1)
    return Comparison(scenario, spec, workload, ratio), prepared


def comparison_run(comparison: Comparison, name: str) -> StrategyRun:
    return next(r for r in comparison.runs if r.name == name)


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
