"""Hit rate against gateway replicas x sync delay: one scenario, each strategy run once per
(replicas, delay) cell on the same workload (pure data; the CLI prints and writes it).

One replica has no peers, so its run does not depend on the delay: it is run once and is the
reference every other cell is compared with (``hit_rate_vs_one_points``). A delay of ``None``
is the "no sync" column: replicas learn only what they routed themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from warmfleet.core.progress import NoProgress, RunProgress
from warmfleet.routing.config import StrategyConfig
from warmfleet.sim.gateways import GatewaySync
from warmfleet.sim.runner import StrategyRun, configs_report, prepare_comparison, run_strategy
from warmfleet.sim.scenario import BuiltWorkload, ScenarioSpec
from warmfleet.sim.workloads.traces import Trace

REPLICA_CHOICE = "uniform per request (seeded random.Random)"


@dataclass(frozen=True, slots=True)
class SweepCell:
    """One strategy's run with ``replicas`` replicas and ``sync_delay_ms`` (None: no sync)."""

    strategy: str
    replicas: int
    sync_delay_ms: float | None
    run: StrategyRun

    @property
    def hit_rate(self) -> float:
        return self.run.metrics.hit_rate


@dataclass(slots=True)
class ReplicaSweep:
    """The cells of a sweep plus what it ran on (for the report)."""

    scenario: ScenarioSpec
    requests: int
    replicas: tuple[int, ...]
    sync_delays_ms: tuple[float | None, ...]
    cells: list[SweepCell] = field(default_factory=list)
    configs: Mapping[str, StrategyConfig] = field(default_factory=dict)  # other than defaults

    def cell(self, strategy: str, replicas: int, sync_delay_ms: float | None) -> SweepCell:
        """The cell's run (one replica: its one run, whatever the delay)."""
        for c in self.cells:
            if (c.strategy, c.replicas) == (strategy, replicas) and (
                replicas == 1 or c.sync_delay_ms == sync_delay_ms
            ):
                return c
        raise KeyError((strategy, replicas, sync_delay_ms))

    def strategies(self) -> list[str]:
        return list(dict.fromkeys(c.strategy for c in self.cells))

    def reference(self, strategy: str) -> float | None:
        """The one-replica hit rate, if the sweep ran one replica."""
        if 1 not in self.replicas:
            return None
        return self.cell(strategy, 1, None).hit_rate

    def report(self) -> dict[str, object]:
        runs: dict[str, list[dict[str, object]]] = {}
        for strategy in self.strategies():
            one = self.reference(strategy)
            rows = runs[strategy] = []
            for replicas in self.replicas:
                for delay_ms in self.sync_delays_ms:
                    c = self.cell(strategy, replicas, delay_ms)
                    m = c.run.metrics
                    rows.append(
                        {
                            "gateway_replicas": replicas,
                            "sync_delay_ms": delay_ms,
                            "synced": delay_ms is not None,
                            "hit_rate": m.hit_rate,
                            "hit_rate_vs_one_points": (
                                None if one is None else 100.0 * (m.hit_rate - one)
                            ),
                            "conserved": c.run.conserved,
                            "metrics": m.as_report(),
                        }
                    )
        spec = self.scenario
        return {
            "scenario": spec.name,
            "preset": spec.preset,
            "seed": spec.seed,
            "instances": spec.instances,
            "requests": self.requests,
            "router_overhead_ms": spec.router_overhead_ms,
            "kv_events_delay_ms": spec.kv_events_delay_ms,  # None: no KV events
            "replica_choice": REPLICA_CHOICE,
            "gateway_replicas": list(self.replicas),
            "sync_delays_ms": list(self.sync_delays_ms),
            "strategies": runs,
            "strategy_configs": configs_report(self.configs),
        }


def run_replica_sweep(
    scenario: ScenarioSpec,
    strategies: Sequence[str],
    replicas: Sequence[int],
    sync_delays_ms: Sequence[float | None],
    *,
    trace: Trace | None = None,
    rate_rps: float | None = None,
    concurrency: int | None = None,
    progress: RunProgress | None = None,
    on_workload: Callable[[BuiltWorkload], None] | None = None,
    configs: Mapping[str, StrategyConfig] | None = None,
) -> ReplicaSweep:
    """Every strategy at every (replicas, delay) cell, on one workload (``progress``: a phase
    per cell, one unit per finished request; ``on_workload``: the workload, once built;
    ``configs``: by name, the strategies' settings other than their defaults)."""
    progress = progress or NoProgress()
    comparison, prepared = prepare_comparison(
        scenario, trace=trace, rate_rps=rate_rps, concurrency=concurrency, progress=progress,
        on_workload=on_workload,
    )  # fmt: skip
    sweep = ReplicaSweep(
        comparison.scenario,
        len(prepared.requests),
        tuple(dict.fromkeys(replicas)),
        tuple(dict.fromkeys(sync_delays_ms)),
        configs=dict(configs or {}),
    )
    for name in strategies:
        for n in sweep.replicas:
            for delay_ms in sweep.sync_delays_ms if n > 1 else (None,):
                sync = GatewaySync(n, None if delay_ms is None else delay_ms / 1000.0)
                run = run_strategy(
                    name,
                    comparison.scenario,
                    comparison.engine,
                    comparison.workload,
                    prepared,
                    gateways=sync,
                    config=sweep.configs.get(name),
                    progress=_CellProgress(progress, _cell_label(n, delay_ms)),
                )
                sweep.cells.append(SweepCell(name, n, delay_ms, run))
    return sweep


@dataclass(frozen=True, slots=True)
class _CellProgress:
    """A cell's run reported as ``<strategy> <cell>``."""

    inner: RunProgress
    cell: str

    def phase(self, name: str, total: int) -> None:
        self.inner.phase(f"{name} {self.cell}", total)

    def advance(self, done: int = 1) -> None:
        self.inner.advance(done)


def _cell_label(replicas: int, sync_delay_ms: float | None) -> str:
    if replicas == 1:
        return "x1"
    return f"x{replicas} " + ("no sync" if sync_delay_ms is None else f"sync {sync_delay_ms:g} ms")
