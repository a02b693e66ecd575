"""Claims (``routing.claims``): with engine KV events, a request routed before the events of
the one it continues arrived still finds its prefix where that one went; the engine's word
(stored, removed, cleared) wins, and an unconfirmed claim lapses after ``claim_ttl_s``."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from routing_support import chain, ids, key

from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.routing.claims import Claims
from warmfleet.routing.config import PrefixAffinityConfig, RoutingConfig
from warmfleet.routing.exact_index import ExactPrefixIndex
from warmfleet.routing.router import Router
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy


def exact_router(**overrides: float) -> tuple[Router, PrefixAffinityStrategy]:
    """Three instances that report KV events (known, empty so far)."""
    r = Router(RoutingConfig(strategy=PrefixAffinityConfig(**overrides)), random.Random(0))
    r.on_instances_changed(ids(3))
    sink = r.kv_event_sink
    assert sink is not None
    for iid in ids(3):
        sink.on_instance_cleared(iid)
    assert isinstance(r.strategy, PrefixAffinityStrategy)
    return r, r.strategy


def at(now_s: float) -> FleetSnapshot:
    return FleetSnapshot(tuple(InstanceState(i) for i in ids(3)), now_s)


def route(r: Router, k: RoutingKey, now_s: float) -> Decision:
    d = r.strategy.choose(k, at(now_s))
    r.strategy.on_routed(k, d)
    return d


def turns() -> tuple[RoutingKey, RoutingKey]:
    first = chain(random.Random(7), 10)
    return key(first), key(chain(random.Random(8), 6, first))


def test_next_turn_before_the_events_goes_where_the_first_went() -> None:
    r, _ = exact_router()
    first, second = turns()
    d1 = route(r, first, 10.0)
    assert d1.reason is Reason.NO_MATCH
    d2 = route(r, second, 10.5)  # the engine has reported nothing yet
    assert (d2.instance_id, d2.reason, d2.predicted_cached_blocks) == (
        d1.instance_id,
        Reason.PREFIX_HIT,
        10,
    )


def test_without_claims_the_next_turn_starts_cold_elsewhere() -> None:
    r, _ = exact_router(claim_ttl_s=0.0)
    first, second = turns()
    d1 = route(r, first, 10.0)
    d2 = route(r, second, 10.5)
    assert d2.reason is Reason.NO_MATCH
    assert d2.instance_id != d1.instance_id


def test_a_claim_lapses_unless_the_engine_confirms_it() -> None:
    r, s = exact_router(claim_ttl_s=2.0)
    first, second = turns()
    pod = route(r, first, 10.0).instance_id
    assert s.match(second, 11.9) == {pod: 10}
    assert s.match(second, 12.0) == {}
    assert r.kv_event_sink is not None
    r.kv_event_sink.on_blocks_stored(pod, first.block_hashes)
    assert s.match(second, 100.0) == {pod: 10}


def test_the_engines_removal_and_clearing_win_over_a_claim() -> None:
    r, s = exact_router()
    first, _ = turns()
    pod = route(r, first, 10.0).instance_id
    sink = r.kv_event_sink
    assert sink is not None
    sink.on_blocks_removed(pod, first.block_hashes[4:])
    assert s.match(first, 10.1) == {pod: 4}
    sink.on_instance_cleared(pod)
    assert s.match(first, 10.1) == {}


def test_claims_start_where_the_engine_report_ends() -> None:
    r, s = exact_router()
    first, second = turns()
    sink = r.kv_event_sink
    assert sink is not None
    sink.on_blocks_stored("pod-2", first.block_hashes)
    d = route(r, second, 10.0)
    assert (d.instance_id, d.predicted_cached_blocks) == ("pod-2", 10)
    assert s.exact_index.claims.count("pod-2", 10.0) == 6  # the new blocks only
    assert s.match(second, 10.5) == {"pod-2": 16}


def test_blocks_reported_already_are_not_claimed() -> None:
    """A peer's note can arrive after the events of the blocks it routed: nothing to claim."""
    index = ExactPrefixIndex(claim_ttl_s=2.0)
    blocks = chain(random.Random(9), 6)
    index.on_blocks_stored("a", blocks[:4])
    index.claim("a", blocks, 1, now_s=0.0)
    assert index.claims.counts.claimed == 2
    assert index.claims.count("a", 0.0) == 2


def test_instances_without_events_keep_the_approximate_index() -> None:
    r = Router(RoutingConfig(strategy=PrefixAffinityConfig()), random.Random(0))
    r.on_instances_changed(ids(3))
    s = r.strategy
    assert isinstance(s, PrefixAffinityStrategy)
    first, _ = turns()
    pod = route(r, first, 10.0).instance_id
    assert s.exact_index.claims.count(pod, 10.0) == 0
    assert s.match(first, 1000.0) == {pod: 10}


def test_claim_ttl_is_configured_and_validated() -> None:
    doc = {"strategy": {"type": "prefix_affinity", "claimTtlS": 0.5}}
    config = parse_document(RoutingConfig, doc, "routing")
    assert isinstance(config.strategy, PrefixAffinityConfig)
    assert config.strategy.claim_ttl_s == 0.5
    with pytest.raises(ConfigError, match="claimTtlS"):
        parse_document(
            RoutingConfig, {"strategy": {"type": "prefix_affinity", "claimTtlS": -1}}, "routing"
        )


def test_claims_count_how_they_ended() -> None:
    claims, rng = Claims(ttl_s=2.0), random.Random(4)
    a, b, c = chain(rng, 4), chain(rng, 3), chain(rng, 2)
    claims.claim("x", a, 0, 0.0)
    claims.extend("x", a, 0, 1.0)
    claims.drop("x", a[:2], stored=True)  # within the TTL
    claims.drop("x", a[2:3])  # removed: the engine's word, not a confirmation
    claims.claim("x", b, 0, 1.5)
    claims.extend("x", b, 0, 3.0)  # a's last claim lapsed (not pruned yet)
    claims.drop("x", b[:1], stored=True)  # within the TTL (1.5 + 2.0 > 3.0)
    claims.claim("x", c, 0, 3.2)  # prunes a's lapsed block
    claims.extend("x", c, 0, 4.0)  # b lapsed by now
    claims.drop("x", b[1:], stored=True)  # after the TTL
    claims.claim("x", c, 0, 4.5)  # renews c: its first claim ends in nothing
    counts = claims.counts
    assert (counts.claimed, counts.confirmed, counts.late) == (11, 3, 2)
    assert (counts.lapsed, counts.displaced) == (1, 0)
    claims.forget("x")  # the claims of a cleared instance end in nothing
    assert counts.lapsed == 1
    assert claims.instances() == ()


def test_claims_stay_within_their_bound() -> None:
    claims = Claims(ttl_s=5.0, max_blocks=100)
    rng = random.Random(3)
    for i in range(20):
        claims.claim("a", chain(rng, 30), 0, float(i) / 100)
    assert claims.count("a", 0.5) == 90  # whole claims: the last three of 30 blocks
    assert (claims.counts.claimed, claims.counts.displaced) == (600, 510)
    assert claims.instances() == ("a",)


Op = tuple[str, int, int, int]  # (kind, instance, chain, start)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["claim", "stored", "removed", "forget", "tick"]),
            st.integers(0, 2),
            st.integers(0, 3),
            st.integers(0, 12),
        ),
        max_size=40,
    )
)
def test_claims_answer_as_a_plain_map_of_lapse_times(ops: list[Op]) -> None:
    """Against a reference that keeps (instance, hash) -> latest lapse time, and counts how
    claims ended: pruned lapsed at the instance's next claim; confirmed or late when stored."""
    rng = random.Random(1)
    base = chain(rng, 6)
    chains = [chain(rng, 6, base) for _ in range(4)]
    claims, model = Claims(ttl_s=1.0), dict[tuple[int, int], float]()
    counts = {"claimed": 0, "confirmed": 0, "late": 0, "lapsed": 0}
    now = latest = 0.0
    for kind, inst, c, start in ops:
        hashes = chains[c]
        if kind == "claim":
            claims.claim(str(inst), hashes, start, now)
            lapsed = [k for k, v in model.items() if k[0] == inst and v <= now]
            counts["lapsed"] += len(lapsed) if start < len(hashes) else 0
            for k in lapsed if start < len(hashes) else []:
                del model[k]
            model.update({(inst, h): now + 1.0 for h in hashes[start:]})
            counts["claimed"] += len(hashes[start:])
            latest = now if start < len(hashes) else latest
        elif kind in {"stored", "removed"}:
            claims.drop(str(inst), hashes[start:], stored=kind == "stored")
            for h in hashes[start:]:
                lapses = model.pop((inst, h), None)
                if lapses is not None and kind == "stored":
                    counts["confirmed" if lapses > latest else "late"] += 1
        elif kind == "forget":
            claims.forget(str(inst))
            model = {k: v for k, v in model.items() if k[0] != inst}
        else:
            now += 0.5  # two ticks: a claim lapses
        for i in range(3):
            for hs in chains:
                depth = min(start, len(hs))
                want = depth
                while want < len(hs) and model.get((i, hs[want]), now) > now:
                    want += 1
                assert claims.extend(str(i), hs, depth, now) == want
        latest = now
        assert {k: getattr(claims.counts, k) for k in counts} == counts
