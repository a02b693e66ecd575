"""The real-vLLM e2e's replica starts (vllm_harness.run): synced replicas whose sync port was
taken between being picked and being bound start again on new ports instead of failing the run
(seen once in a loop of e2e cases: "Address already in use" on a sync port)."""

from __future__ import annotations

import argparse
import socket
from contextlib import ExitStack
from pathlib import Path

import pytest
from e2e_tokenizer_helpers import write_model
from vllm_harness import run as harness
from vllm_harness.engines import EngineSpec
from vllm_harness.gateways import Replica

from warmfleet.bench.live_fleet import consecutive_free_ports
from warmfleet.bench.live_procs import START_ATTEMPTS
from warmfleet.core.errors import ConfigError

pytestmark = pytest.mark.timeout(60)
SYNCED = {"type": "prefix_affinity", "useExactIndex": False}


def e2e(tmp_path: Path) -> harness.E2E:
    model_dir = write_model(tmp_path)
    args = argparse.Namespace(model_dir=model_dir, seed=0, log_dir=tmp_path / "logs")
    run = harness.E2E(args)
    run.engines = [EngineSpec("vllm-0", consecutive_free_ports(1), 0)]
    return run


def held_ports(monkeypatch: pytest.MonkeyPatch, taken: int) -> tuple[list[int], ExitStack]:
    """The first ``taken`` picks of sync ports come back with their first port already bound
    and listening (another process's, for the gateway); the picks made are listed, and the
    stack closes the holding sockets."""
    holders = ExitStack()
    picks: list[int] = []

    def pick(count: int) -> int:
        base = consecutive_free_ports(count)
        picks.append(base)
        if len(picks) <= taken:
            holder = holders.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            holder.bind(("127.0.0.1", base))
            holder.listen()
        return base

    monkeypatch.setattr(harness, "consecutive_free_ports", pick)
    return picks, holders


async def test_synced_replicas_start_again_when_a_sync_port_was_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = e2e(tmp_path)
    picks, holders = held_ports(monkeypatch, taken=1)
    started: list[Replica] = []
    try:
        with holders:
            await run._start_replicas(started, SYNCED, 2, exact=False, synced=True, capture=None)
            assert len(picks) == 2
            assert len(started) == 2
            endpoints = [r.gateway.replica_sync.endpoint for r in started if r.gateway.replica_sync]
            assert endpoints == [f"tcp://127.0.0.1:{picks[1] + 2 * i}" for i in range(2)]
    finally:
        for replica in started:
            await replica.stop()


async def test_a_port_taken_on_every_attempt_fails_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = e2e(tmp_path)
    picks, holders = held_ports(monkeypatch, taken=START_ATTEMPTS)
    started: list[Replica] = []
    with holders:
        with pytest.raises(ConfigError, match=r"spec\.replicaSync\.listen: cannot bind"):
            await run._start_replicas(started, SYNCED, 2, exact=False, synced=True, capture=None)
        assert started == []
        assert len(picks) == START_ATTEMPTS
