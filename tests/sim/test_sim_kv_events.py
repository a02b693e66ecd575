"""The simulated engines' KV events: an exact index fed by them mirrors the engine's cache, they
arrive after their delay, every replica hears them, and a drained instance's are dropped."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from support.engines import engine_spec
from warmfleet.bench import sim_cli
from warmfleet.core.errors import ConfigError
from warmfleet.engine.events import EngineRequest
from warmfleet.engine.model import EngineModel
from warmfleet.routing.base import kv_event_sink_of
from warmfleet.routing.exact_index import ExactPrefixIndex
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy
from warmfleet.sim.gateways import GatewaySync
from warmfleet.sim.kv_feed import KvEventFeed, KvEventsSim
from warmfleet.sim.runner import prepare_comparison, routing_keys
from warmfleet.sim.scenario import EngineOverrides, ScenarioSpec, parse_scenario
from warmfleet.sim.simulator import ScaleEvent, SimConfig, SimResult, Simulator
from warmfleet.sim.workloads.synthetic import GspConfig

SMALL = engine_spec(name="kv-feed-test", kv_capacity_tokens=24 * 16, max_model_len=4096)

GSP = GspConfig(
    groups=12, prompts_per_group=8, system_prompt_tokens=512, question_tokens=64, output_tokens=16
)
CACHE = EngineOverrides(kv_capacity_tokens=1024)  # 8 blocks of 128 tokens: under two prompts

# A prompt: a path in a tree of blocks (each step one of 3 branches); its chain names each
# prefix of the path, so prompts sharing a beginning share their chain's beginning.
paths = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=30)


def _chain(path: list[int], ids: dict[tuple[int, ...], int]) -> tuple[int, ...]:
    return tuple(ids.setdefault(tuple(path[: i + 1]), len(ids) + 1) for i in range(len(path)))


@settings(max_examples=60, deadline=None)
@given(paths, st.integers(0, 3))
def test_fed_index_mirrors_the_engines_cache(prompts: list[list[int]], spacing: int) -> None:
    """After every step the engine takes, the exact index fed by its events (delay 0) holds
    exactly the engine's cached prefix of every prompt: its stores and its evictions (24 blocks
    of cache for up to 30 prompts of up to 12 blocks)."""
    feed_index = ExactPrefixIndex()
    feed = KvEventFeed(KvEventsSim(0.0), [feed_index])
    engine = EngineModel(SMALL, block_listener=feed.listener("i0"))
    ids: dict[tuple[int, ...], int] = {}
    chains = [_chain(p, ids) for p in prompts]
    now_s = 0.0
    for n, chain in enumerate(chains):
        prompt_tokens = len(chain) * SMALL.block_tokens + 3
        engine.submit(EngineRequest(n, chain, prompt_tokens, 2), now_s)
        for _ in range(spacing if n < len(chains) - 1 else 10_000):
            at_s = engine.next_event_s()
            if at_s is None:
                break
            now_s = at_s
            engine.advance(at_s)
            if feed.flush(now_s) is not None:
                feed.deliver(now_s, lambda _iid: True)
            for c in chains:
                held = feed_index.match(c).get("i0", 0)
                assert held == engine.cached_prefix_blocks(c), (c, held)
    assert engine.next_event_s() is None


def _run(
    kv: KvEventsSim | None, *, replicas: int = 1, remove_at_s: float | None = None
) -> tuple[SimResult, list[PrefixAffinityStrategy]]:
    """12 groups of prompts sharing a system prompt on 4 instances whose caches evict, ``replicas``
    gateway replicas without sync; the replicas' strategies returned with the result."""
    scenario = ScenarioSpec(
        name="gsp", workload=GSP, instances=4, preset="tiny-cpu", engine=CACHE, seed=0
    )
    comparison, prepared = prepare_comparison(scenario)
    keys = routing_keys(prepared, DEFAULT_PREFIX_LENGTH)
    strategies: list[PrefixAffinityStrategy] = []

    def build(replica: int) -> PrefixAffinityStrategy:
        strategy = build_strategy(strategy_config("prefix_affinity"), random.Random(replica))
        assert isinstance(strategy, PrefixAffinityStrategy)
        strategies.append(strategy)
        return strategy

    sync = GatewaySync(replicas, None if replicas > 1 else 0.0)
    events = () if remove_at_s is None else (ScaleEvent(remove_at_s, "remove", "i3"),)
    config = SimConfig(4, comparison.engine, scale_events=events, kv_events=kv)
    routing = sync.build(build, random.Random(0))
    return Simulator(config, routing, prepared.requests, keys).run(), strategies


def _decisions(result: SimResult) -> list[tuple[str, str]]:
    return [(r.instance_id, r.reason) for r in result.records]


def test_events_arrive_after_their_delay() -> None:
    """Events that would arrive after the run change nothing (the index never reports, so
    routing is approximate: the same decisions as without events); at once they are used:
    other decisions, and claims made on routing confirmed by the engines' stores."""
    without, _ = _run(None)
    never, late = _run(KvEventsSim(1e6))
    assert _decisions(never) == _decisions(without)
    assert late[0].exact_index.reporting  # (delivered when the loop empties, after the run)
    prompt, exact = _run(KvEventsSim(0.0))
    assert _decisions(prompt) != _decisions(without)
    counts = exact[0].exact_index.claims.counts
    assert counts.claimed > 0
    assert counts.confirmed > 0


def test_every_replica_hears_the_engines() -> None:
    """Unsynced replicas learn only their own routings, but each one's exact index hears
    every engine: all four instances reported to each replica."""
    _, strategies = _run(KvEventsSim(0.005), replicas=3)
    assert len(strategies) == 3
    for strategy in strategies:
        assert all(strategy.exact_index.knows(f"i{n}") for n in range(4))


def test_a_removed_instances_events_are_dropped() -> None:
    """Once an instance is removed (it drains its requests), its later events do not reach
    the router, which forgot it."""
    plain, _ = _run(KvEventsSim(0.0))
    # just after a request was routed to i3, before it reaches the engine (the router's
    # overhead later), which then stores its blocks
    routed_s = next(r.arrival_s for r in plain.records if r.instance_id == "i3" and r.index > 40)
    result, strategies = _run(KvEventsSim(0.0), remove_at_s=routed_s + 1e-4)
    assert any(r.instance_id == "i3" and r.first_token_s > routed_s for r in result.records)
    assert not strategies[0].exact_index.knows("i3")
    assert strategies[0].exact_index.knows("i0")


def test_kv_events_need_the_engine_model() -> None:
    with pytest.raises(ValueError, match="engine model"):
        Simulator(
            SimConfig(1, SMALL, kv_events=KvEventsSim(0.0)),
            build_strategy(strategy_config("random"), random.Random(0)),
            [],
            [],
            servers=lambda: EngineModel(SMALL),
        )
    with pytest.raises(ValueError, match="delay_s"):
        KvEventsSim(-1.0)


def test_feed_ignores_strategies_without_an_exact_index() -> None:
    assert kv_event_sink_of(build_strategy(strategy_config("random"), random.Random(0))) is None
    feed = KvEventFeed(KvEventsSim(0.0), [None])
    feed.listener("i0").block_stored(7)
    assert feed.flush(1.0) == 1.0
    feed.deliver(1.0, lambda _iid: True)
    assert feed.delivered_events == 1
    assert feed.flush(2.0) is None  # nothing new


app = typer.Typer()
sim_cli.register(app)


def test_sim_cli_kv_events(tmp_path: Path) -> None:
    """``--kv-events-delay-ms`` reaches the run, its report and its table's title; a scenario
    file sets it as ``kvEventsDelayMs``; a negative or infinite delay is refused."""
    out = tmp_path / "out.json"
    base = [
        "sim", "--scenario", "gsp", "--requests", "40", "--preset", "tiny-cpu",
        "--instances", "2", "--strategies", "prefix_affinity", "--rate", "4",
    ]  # fmt: skip
    result = CliRunner().invoke(app, [*base, "--kv-events-delay-ms", "5", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "KV events 5 ms" in " ".join(result.output.split())  # (the title wraps)
    assert json.loads(out.read_text())["kv_events_delay_ms"] == 5.0
    sweep = CliRunner().invoke(
        app, [*base, "--kv-events-delay-ms", "0", "--gateway-replicas", "1,2", "--format", "json"]
    )
    assert sweep.exit_code == 0, sweep.output
    assert json.loads(sweep.stdout)["kv_events_delay_ms"] == 0.0
    plain = CliRunner().invoke(app, [*base, "--json", str(out)])
    assert plain.exit_code == 0, plain.output
    assert json.loads(out.read_text())["kv_events_delay_ms"] is None
    for bad in ("-1", "inf"):
        refused = CliRunner().invoke(app, [*base, "--kv-events-delay-ms", bad])
        assert refused.exit_code == 2, refused.output
        assert "kv-events-delay-ms" in refused.output


def test_scenario_file_kv_events_delay() -> None:
    doc = "name: s\nworkload: {type: gsp}\nkvEventsDelayMs: 20\n"
    assert parse_scenario(doc, "s.yaml").kv_events_delay_ms == 20.0
    with pytest.raises(ConfigError, match="kvEventsDelayMs"):
        parse_scenario(doc.replace("20", "-3"), "s.yaml")
