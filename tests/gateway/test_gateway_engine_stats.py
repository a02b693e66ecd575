"""The engines' queue and KV usage polled from their metrics (``gateway.engine_stats``) for the
strategies that read them: the parser, the probe, and ``llmd_approx`` routing on them live."""

from __future__ import annotations

import random

import aiohttp
import pytest
from gateway_support import backends_running, chat, gateway_config, gateway_running
from replica_sync_support import hears, stub_doc, sync_ports, sync_section

from support.waiting import wait_until
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.engine_stats import (
    STALE_MIN_S,
    EngineStatsProbe,
    engine_stats,
)
from warmfleet.gateway.kv_events.wiring import KvEventFeed
from warmfleet.routing.base import engine_stats_interval_of
from warmfleet.routing.config import LlmdApproxConfig, PrefixAffinityConfig, RoutingConfig
from warmfleet.routing.factory import build_strategy

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %s
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} %s
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
"""
SGLANG = """# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="g"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="g"} 0.25
"""


def test_vllm_and_sglang_figures_are_read() -> None:
    assert engine_stats(VLLM % ("3.0", "0.5")) == (3, 0.5)
    assert engine_stats(SGLANG) == (7, 0.25)
    old = "vllm:gpu_cache_usage_perc 0.75\nvllm:num_requests_waiting 2\n"  # before vLLM V1
    assert engine_stats(old) == (2, 0.75)
    # two engines behind one address (data-parallel ranks): queues add up, usage is the highest
    ranks = VLLM % ("1.0", "0.2") + VLLM.replace('engine="0"', 'engine="1"') % ("5.0", "0.9")
    assert engine_stats(ranks) == (6, 0.9)
    assert engine_stats("vllm:kv_cache_usage_perc 1.5\n") == (0, 1.0)  # clamped
    odd = 'vllm:num_requests_waiting{model_name="a}b"} 4 1700000000000\n'  # a "}", a timestamp
    assert engine_stats("# HELP vllm:num_requests_waiting 9 waiting\n" + odd) == (4, 0.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "vllm:num_requests_running 3\n",  # running is not waiting
        "vllm:num_requests_waiting_total 3\n",  # another series whose name starts the same
        "<html>not metrics</html>\n",
        "\x00\xff" * 100,
    ],
)
def test_no_figures_is_none(text: str) -> None:
    assert engine_stats(text) is None


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1", "many"])
def test_a_value_that_is_no_count_is_left_out(value: str) -> None:
    assert engine_stats(VLLM % (value, "0.5")) == (0, 0.5)
    assert engine_stats(VLLM % ("2", value)) == (2, 0.0)


def test_a_router_fed_by_kv_events_still_asks_for_its_strategy() -> None:
    """With engine KV events the variant's router is an ``ExactModeRouter`` around the
    ``Router``: the poller asks the router, which asks the strategy it wraps."""
    build = KvEventFeed("m").router_factory(None)
    llmd = RoutingConfig(strategy=LlmdApproxConfig(refresh_metrics_interval_ms=200))
    assert build(llmd, random.Random(0)).engine_stats_interval_s == 0.2
    plain = RoutingConfig(strategy=PrefixAffinityConfig())
    assert build(plain, random.Random(0)).engine_stats_interval_s is None


def test_only_strategies_that_read_engine_figures_ask_for_them() -> None:
    llmd = build_strategy(LlmdApproxConfig(refresh_metrics_interval_ms=200), random.Random(0))
    assert engine_stats_interval_of(llmd) == 0.2
    assert (
        engine_stats_interval_of(build_strategy(PrefixAffinityConfig(), random.Random(0))) is None
    )
    assert engine_stats_interval_of(None) is None


async def test_probe_reads_the_engines_of_variants_that_ask_and_forgets_stale_figures() -> None:
    async with backends_running("a", "b") as (a, b):
        a.metrics_text = VLLM % ("3", "0.5")
        b.metrics_text = SGLANG
        strategy = {"type": "llmd_approx", "refreshMetricsIntervalMs": 100}
        config = gateway_config([a, b], strategy=strategy)
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            variant = gw.gateway.state.endpoints["main"].variants["v1"]
            now = [0.0]
            probe = EngineStatsProbe(gw.gateway.state, client, clock=lambda: now[0])
            assert await probe.poll_once() == pytest.approx(0.1)
            ia, ib = variant.instances["a"], variant.instances["b"]
            assert (ia.state.waiting_requests, ia.state.kv_usage_frac) == (3, 0.5)
            assert (ib.state.waiting_requests, ib.state.kv_usage_frac) == (7, 0.25)
            # the snapshot the strategy is given carries them
            shown = {s.instance_id: s for s in variant.snapshot().instances}
            assert (shown["a"].waiting_requests, shown["b"].kv_usage_frac) == (3, 0.25)
            described = {i["id"]: i for i in variant.describe()["instances"]}  # the admin API
            assert (described["b"]["waiting_requests"], described["b"]["kv_usage_frac"]) == (
                7,
                0.25,
            )

            a.metrics_text = None  # unreadable: the last figures stand until they are stale
            now[0] = STALE_MIN_S
            await probe.poll_once()
            assert ia.state.waiting_requests == 3
            now[0] = STALE_MIN_S + 0.01
            await probe.poll_once()
            assert (ia.state.waiting_requests, ia.state.kv_usage_frac) == (0, 0.0)
            assert ib.state.waiting_requests == 7

            # the strategy changed live to one that reads no engine figures: none is shown
            variant.set_routing(RoutingConfig(strategy=PrefixAffinityConfig()))
            assert await probe.poll_once() is None
            assert (ib.state.waiting_requests, ib.state.kv_usage_frac) == (0, 0.0)


async def test_no_variant_asks_no_engine_is_read() -> None:
    async with backends_running("a") as (a,):
        a.metrics_text = VLLM % ("3", "0.5")
        config = gateway_config([a], strategy={"type": "prefix_affinity"})
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            before = a.stats.metrics_reads
            probe = EngineStatsProbe(gw.gateway.state, client)
            assert await probe.poll_once() is None
            ia = gw.gateway.state.endpoints["main"].variants["v1"].instances["a"]
            assert ia.state.waiting_requests == 0
            assert a.stats.metrics_reads == before


async def test_llmd_approx_routes_away_from_a_long_engine_queue_live() -> None:
    """The engines' queues reach ``llmd_approx`` through the gateway's own poller: with equal
    prefix scores (a prompt nobody has seen), the instance whose engine queues 9 requests loses
    to the one that queues none, request after request."""
    async with backends_running("a", "b") as (a, b):
        a.metrics_text = VLLM % ("9", "0.1")
        b.metrics_text = VLLM % ("0", "0.1")
        strategy = {"type": "llmd_approx", "refreshMetricsIntervalMs": 20}
        config = gateway_config([a, b], strategy=strategy)
        async with gateway_running(config) as gw, aiohttp.ClientSession() as client:
            ia = gw.gateway.state.endpoints["main"].variants["v1"].instances["a"]
            await wait_until(lambda: ia.state.waiting_requests == 9, what="a's queue polled")
            for n in range(6):
                body = chat([{"role": "user", "content": f"question {n} " * 40}])
                async with client.post(gw.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    assert r.headers["x-warmfleet-instance"] == "b"


async def test_llmd_approx_over_synced_replicas_reads_both_the_queues_and_the_peer() -> None:
    """Two synced replicas route with ``llmd_approx``: each polls the engines itself, and a
    conversation's next turn reaching the other replica goes where its peer sent the first,
    though that engine now queues 2 requests and the other none (prefix 3 x ~0.9 against
    queue 2 x 1). Without the peer's note it would score no prefix and follow the queues, as
    a prompt nobody has seen does."""
    async with backends_running("x", "y") as backends:
        for backend in backends:
            backend.metrics_text = VLLM % ("0", "0.1")
        port_a, port_b = sync_ports(2)
        docs = [
            stub_doc(backends, sync_section(name, port, [peer]), "llmd_approx")
            for name, port, peer in (("a", port_a, port_b), ("b", port_b, port_a))
        ]
        async with (
            gateway_running(parse_gateway_config(docs[0])) as a,
            gateway_running(parse_gateway_config(docs[1])) as b,
            aiohttp.ClientSession() as client,
        ):
            sync_a, sync_b = a.gateway.replica_sync, b.gateway.replica_sync
            assert sync_a is not None
            assert sync_b is not None
            await wait_until(lambda: hears(sync_b, sync_a), what="b hears a")
            first = [
                {"role": "system", "content": "a long shared context of the agent " * 100},
                {"role": "user", "content": "the first question"},
            ]
            url = "/v1/chat/completions"
            async with client.post(a.url + url, json=chat(first)) as r:
                assert r.status == 200
                routed = r.headers["x-warmfleet-instance"]
            other = "y" if routed == "x" else "x"
            busy = next(backend for backend in backends if backend.name == routed)
            busy.metrics_text = VLLM % ("2", "0.1")
            view_b = b.gateway.state.endpoints["main"].variants["v1"]
            await wait_until(
                lambda: view_b.instances[routed].state.waiting_requests == 2,
                what="b polled the busy engine's queue",
            )
            await wait_until(lambda: sync_b.metrics.received.value >= 2, what="a's notes")
            turn = [*first, {"role": "assistant", "content": "an answer"},
                    {"role": "user", "content": "the next question"}]  # fmt: skip
            async with client.post(b.url + url, json=chat(turn)) as r:
                assert r.status == 200
                assert r.headers["x-warmfleet-instance"] == routed
            fresh = [{"role": "user", "content": "a question nobody asked before " * 40}]
            async with client.post(b.url + url, json=chat(fresh)) as r:
                assert r.headers["x-warmfleet-instance"] == other
