"""The engines' KV capacity read from their metrics (``gateway.kv_capacity``): the parser, the
conversion to routing-key blocks, and the probe feeding ``prefix_affinity``'s index."""

from __future__ import annotations

import aiohttp
import pytest
from gateway_support import backends_running, chat, gateway_config, gateway_running

from support.waiting import wait_until
from warmfleet.gateway import kv_capacity
from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.kv_capacity import (
    REFRESH_S,
    RETRY_S,
    KvCapacityProbe,
    kv_capacity_tokens,
)
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.replica_sync.router import CurrentRouter
from warmfleet.gateway.world import GatewayState
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.replicas import ReplicaView
from warmfleet.routing.router import Router
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy

VLLM = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="%d",enable_prefix_caching="True",num_gpu_blocks="%d"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0.0
"""
SGLANG = """# HELP sglang:max_total_num_tokens Maximum total number of tokens
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{name="google/gemma-2-9b-it"} %s
"""


def test_vllm_and_sglang_capacities_are_read() -> None:
    assert kv_capacity_tokens(VLLM % (16, 2730)) == 16 * 2730
    assert kv_capacity_tokens(SGLANG % "161721.0") == 161_721
    assert kv_capacity_tokens(VLLM % (128, 48) + SGLANG % "99999") == 128 * 48  # the smaller


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n",
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n',  # not computed
        'vllm:cache_config_info{block_size="-16",num_gpu_blocks="10"} 1.0\n',
        SGLANG % "NaN",
        SGLANG % "+Inf",
        SGLANG % "-5",
        "<html>not metrics</html>\n",
        'vllm:cache_config_info{block_size="16" 1.0\n',  # a broken line
        "\x00\xff" * 100,
    ],
)
def test_no_capacity_is_zero(text: str) -> None:
    assert kv_capacity_tokens(text) == 0


def test_capacity_in_key_blocks_follows_the_key_mode() -> None:
    assert KeySpec(mode="tokens", block_size=16).capacity_blocks(1600) == 100
    assert KeySpec(mode="text").capacity_blocks(1600) == 1600 * 4 // 128  # 32 tokens a block
    assert KeySpec(mode="bytes", block_size=64).capacity_blocks(1600) == 100
    assert KeySpec().capacity_blocks(0) == 0


async def test_probe_feeds_the_index_and_keeps_a_known_capacity_when_a_read_fails() -> None:
    async with backends_running("a", "b") as (a, b):
        a.metrics_text = VLLM % (16, 1000)  # 16,000 tokens: 500 text blocks
        config = gateway_config([a, b], strategy={"type": "prefix_affinity"})
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            variant = gw.gateway.state.endpoints["main"].variants["v1"]
            now = [0.0]
            probe = KvCapacityProbe(gw.gateway.state, client, clock=lambda: now[0])
            await probe.poll_once()
            ia, ib = variant.instances["a"], variant.instances["b"]
            assert (ia.kv_capacity_tokens, ia.kv_capacity_blocks) == (16_000, 500)
            assert ib.kv_capacity_blocks == 0  # no /metrics: the default
            shown = {i["id"]: i for i in variant.describe()["instances"]}  # the admin API's view
            assert (shown["a"]["kv_capacity_tokens"], shown["a"]["kv_capacity_blocks"]) == (
                16_000,
                500,
            )
            assert shown["b"]["kv_capacity_blocks"] is None
            gauge = gw.gateway.metrics.registry.get_sample_value(
                "warmfleet_gateway_instance_kv_capacity_blocks",
                {"endpoint": "main", "variant": "v1", "instance_id": "a"},
            )
            assert gauge == 500
            body = chat([{"role": "user", "content": "hello " * 100}])
            async with client.post(gw.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
            router = variant.router
            assert isinstance(router, Router)
            strategy = router.strategy
            assert isinstance(strategy, PrefixAffinityStrategy)
            assert strategy.index.capacity("a") == 500
            assert strategy.index.capacity("b") == strategy.config.default_capacity_blocks

            b.metrics_text = SGLANG % "3200"  # b: asked again after RETRY_S, not before
            await probe.poll_once()
            assert ib.kv_capacity_blocks == 0
            now[0] = RETRY_S
            await probe.poll_once()
            assert ib.kv_capacity_blocks == 100
            a.metrics_text = VLLM % (16, 2000)  # a restarted bigger: read at REFRESH_S
            now[0] = REFRESH_S - 1
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 500
            await a.kill()  # unreadable: the capacity known stays
            now[0] = 2 * REFRESH_S
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 500
            await a.restart()
            now[0] = 2 * REFRESH_S + RETRY_S
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 1000


async def test_an_engine_back_from_down_is_read_again_at_once() -> None:
    """An engine restarted with another cache size: the health probes saw it down, so its
    capacity is read again at the first round it is back, not ``REFRESH_S`` later."""
    async with backends_running("a") as (a,):
        a.metrics_text = VLLM % (16, 1000)
        config = gateway_config([a], strategy={"type": "prefix_affinity"})
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            ia = gw.gateway.state.endpoints["main"].variants["v1"].instances["a"]
            now = [0.0]
            probe = KvCapacityProbe(gw.gateway.state, client, clock=lambda: now[0])
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 500
            a.metrics_text = VLLM % (16, 3000)  # restarted bigger, not seen down: REFRESH_S
            now[0] = RETRY_S
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 500
            ia.active_healthy = False  # what the health probes say while it restarts
            now[0] = 2 * RETRY_S
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 500
            ia.active_healthy = True
            await probe.poll_once()
            assert ia.kv_capacity_blocks == 1500


async def test_an_oversized_metrics_page_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_capacity, "MAX_METRICS_BYTES", 512)
    async with backends_running("a") as (a,):
        a.metrics_text = VLLM % (16, 1000) + "# padding\n" * 100
        async with (
            gateway_running(gateway_config([a])) as gw,
            aiohttp.ClientSession() as client,
        ):
            probe = KvCapacityProbe(gw.gateway.state, client)
            assert await probe.read(a.url) is None
            a.metrics_text = VLLM % (16, 1000)
            assert await probe.read(a.url) == 16_000


async def test_the_gateway_reads_capacities_on_its_own() -> None:
    async with backends_running("a") as (a,):
        a.metrics_text = VLLM % (128, 48)
        async with gateway_running(gateway_config([a])) as gw:
            inst = gw.gateway.state.endpoints["main"].variants["v1"].instances["a"]
            await wait_until(lambda: gw.gateway.kv_capacity.rounds_completed > 0)
            assert inst.kv_capacity_tokens == 128 * 48


def test_both_snapshots_carry_the_capacity() -> None:
    """One gateway's snapshot and a synced replica's (its in-flight counts from the view)."""
    instances = [{"id": i, "url": f"http://127.0.0.1:{k + 1}"} for k, i in enumerate("ab")]
    routing = {"strategy": {"type": "prefix_affinity"}}
    variants = [{"name": "v", "routing": routing, "instances": instances}]
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"endpoints": [{"name": "e", "variants": variants}]},
    }
    state = GatewayState(parse_gateway_config(doc), default_router_factory, GatewayMetrics())
    variant = state.default_endpoint().variant("v")
    variant.instances["a"].set_kv_capacity(16_000, 500)
    view = ReplicaView("r#1", "e/v", CurrentRouter(variant))
    for synced in (None, view):
        variant.replica = synced
        caps = {i.instance_id: i.kv_capacity_blocks for i in variant.snapshot().instances}
        assert caps == {"a": 500, "b": 0}
