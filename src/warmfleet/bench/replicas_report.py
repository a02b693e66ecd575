"""The gateway-replicas table: hit rate per (replicas, sync delay), one table per strategy,
each cell with its difference from one replica in points (fits 100 columns for 5 delays)."""

from __future__ import annotations

from rich.table import Table

from warmfleet.bench.report import kv_events_title
from warmfleet.sim.replica_sweep import ReplicaSweep
from warmfleet.sim.runner import configs_report


def delay_label(delay_ms: float | None) -> str:
    if delay_ms is None:
        return "no sync"
    return f"{delay_ms:g} ms"


def _cell(hit_rate: float, one: float | None, replicas: int) -> str:
    text = f"{100 * hit_rate:.1f}%"
    if one is None or replicas == 1:
        return text
    return f"{text} ({100 * (hit_rate - one):+.1f})"


def replicas_tables(sweep: ReplicaSweep) -> list[Table]:
    """One table per strategy: a row per replica count, a column per sync delay."""
    tables = []
    configs = configs_report(sweep.configs)
    for strategy in sweep.strategies():
        one = sweep.reference(strategy)
        settings = configs.get(strategy)
        named = f"{strategy} ({settings})" if settings else strategy
        title = (
            f"{named} hit rate | {sweep.scenario.name} | {sweep.requests} requests | "
            "(points vs 1 replica)"
        )
        title += kv_events_title(sweep.scenario.kv_events_delay_ms)
        table = Table(title=title)
        table.add_column("replicas", justify="right")
        for delay_ms in sweep.sync_delays_ms:
            table.add_column(delay_label(delay_ms), justify="right")
        for replicas in sweep.replicas:
            row = [str(replicas)]
            for delay_ms in sweep.sync_delays_ms:
                cell = sweep.cell(strategy, replicas, delay_ms)
                row.append(_cell(cell.hit_rate, one, replicas))
            table.add_row(*row)
        tables.append(table)
    return tables
