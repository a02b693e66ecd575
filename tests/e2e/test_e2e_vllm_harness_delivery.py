"""The real-vLLM e2e's synced runs wait, after each request, until the replicas' notes reached
every peer (vllm_harness.gateways.DeliveryWaits): one CI run's `4_synced` read 0.618 against
0.660 because a note waited ~300 ms for a ZeroMQ I/O thread on the 2 shared cores and the next
request's cold start was placed on that stale view (docs/real-vllm.md)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest
from e2e_tokenizer_helpers import write_model
from vllm_harness import run as harness
from vllm_harness.engines import EngineSpec
from vllm_harness.gateways import DeliveryWaits, Replica, delivered

from warmfleet.bench.live_fleet import consecutive_free_ports

pytestmark = pytest.mark.timeout(60)
SYNCED = {"type": "prefix_affinity", "useExactIndex": False}


def state(origin: str, sent: int, heard: dict[str, int], queued: int = 0) -> dict[str, Any]:
    return {
        "origin": origin,
        "batches_sent": sent,
        "last_batch_heard": heard,
        "notes_queued": queued,
    }


def test_delivered_needs_every_peer_to_have_heard_every_batch_sent() -> None:
    a, b = state("a", 3, {"b": 2}), state("b", 2, {"a": 3})
    assert delivered([a, b])
    assert not delivered([a, state("b", 2, {"a": 2})])  # b has not heard a's third batch
    assert not delivered([a, state("b", 2, {})])  # b never heard a
    assert not delivered([state("a", 3, {"b": 2}, queued=1), b])  # a note still queued at a
    assert delivered([state("a", 0, {})])  # no peers
    assert delivered([])  # no synced replicas: nothing to wait for


async def test_the_waits_end_once_a_batch_reached_the_peer_and_time_out_without_peers(
    tmp_path: Path,
) -> None:
    args = argparse.Namespace(model_dir=write_model(tmp_path), seed=0, log_dir=tmp_path / "logs")
    run = harness.E2E(args)
    run.engines = [EngineSpec("vllm-0", consecutive_free_ports(1), 0)]
    started: list[Replica] = []
    try:
        await run._start_replicas(started, SYNCED, 2, exact=False, synced=True, capture=None)
        syncs = [r.gateway.replica_sync for r in started if r.gateway.replica_sync]
        waits = DeliveryWaits(started, timeout_s=10.0)
        while not all(s.caught_up for s in syncs):
            await asyncio.sleep(0.01)
        await waits()
        syncs[0].flush()  # a batch (a heartbeat) its peer reads on its applyDelayMs
        assert not delivered([s.describe() for s in syncs])
        await waits()
        assert delivered([s.describe() for s in syncs])
        assert waits.timeouts == 0
        assert len(waits.waits_s) == 2
        await started.pop().stop()  # the peer is gone: the next batch is never heard
        syncs[0].flush()
        alone = DeliveryWaits(started, timeout_s=0.2)
        await alone()  # one replica left: no peer to wait for
        assert alone.timeouts == 0
        waits.syncs = syncs  # the stopped peer still described: it never hears the new batch
        waits.timeout_s = 0.2
        await waits()
        assert waits.timeouts == 1
        assert waits.summary_ms()["requests"] == 3
        assert waits.summary_ms()["timeouts"] == 1
    finally:
        for replica in started:
            await replica.stop()
