"""The embedded backend end to end: origin, node-agent processes, engine processes, gateway and
the reconciler loop, under a steady load (small model, throttled origin)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from harness.fleet_acceptance import run_acceptance
from warmfleet.local.state import read_state, render


@pytest.mark.slow
async def test_rollover_and_cache_loss_lose_no_request(tmp_path: Path) -> None:
    out = await run_acceptance(
        tmp_path, 6_000_000, 6_000_000, replicas=1, concurrency=2, faults=("delete_cache",)
    )
    # acceptance 1: rollover under load, old cache deleted, warm and cold starts measured
    assert out["requests"]["sent"]["rollover"] > 0
    assert out["rollover_failed_requests"] == 0
    roll = out["rollover"]
    assert roll["old_cache_deleted"]
    assert roll["old_cache_data_gone"]
    assert roll["new_cache"] != roll["old_cache"]
    assert out["cold_start_s"] is not None
    assert out["warm_start_s"] is not None
    assert out["replica_starts"]["cold"] >= 1
    assert out["replica_starts"]["warm"] >= 1
    assert out["weights_bytes_read"] == [6_000_000]  # every replica read the whole model
    assert 0.0 < out["unprepared_replica_share"] < 1.0
    # acceptance 2: the node lost its label, a scale-out avoided it, it was refilled
    (loss,) = out["node_loss"]
    assert loss["scale_out_avoided_lost_node"]
    assert loss["scale_out_replica_prepared"]
    assert out["requests"]["sent"]["node_loss"] > 0
    assert out["node_loss_failed_requests"] == 0
    # a Rolling rollout (one replica: maxSurge 1, maxUnavailable 0) under load
    rolling = out["rolling_rollover"]
    assert rolling["rollout"] == {"type": "Rolling", "maxSurge": 1, "maxUnavailable": 0}
    assert out["requests"]["sent"]["rolling_rollover"] > 0
    assert out["rolling_rollover_failed_requests"] == 0
    assert rolling["max_declared_replicas"] == 2  # the surge, never both revisions in full
    # the state file `warmfleet status` reads, and every process stopped
    doc = read_state(tmp_path)
    assert doc["running"] is False
    console = Console(record=True, width=200)
    render(doc, console)
    text = console.export_text()
    assert "node-a" in text
    assert rolling["new_cache"] in text  # the cache of the last revision
    events = [e["kind"] for e in doc["events"]]
    assert "fault_delete_cache" in events
    assert "replica_stopped" in events
