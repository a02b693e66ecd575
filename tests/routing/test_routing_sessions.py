"""Sessions: where a request's session id comes from, how it is hashed into its key, and how
``prefix_affinity`` keeps a session on its instance (learnt from its own routings and from its
peers' notes alike) within the load bound."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
from pydantic import ValidationError

from warmfleet.core.errors import BadRequestError
from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.factory import build_strategy, strategy_config
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.keys import key_from_blocks
from warmfleet.routing.parse import parse_chat, parse_completions, parse_native, parse_responses
from warmfleet.routing.replicas import ReplicaView
from warmfleet.routing.router import Router
from warmfleet.routing.sessions import (
    DEFAULT_SESSION_HEADERS,
    MAX_SESSION_CHARS,
    SessionHomes,
    session_from_headers,
)
from warmfleet.routing.strategies.prefix_affinity import PrefixAffinityStrategy

IDS = ("a", "b", "c", "d")


def _chat(text: str, **extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def _router(**key: object) -> Router:
    config = RoutingConfig.model_validate({"strategy": {"type": "prefix_affinity"}, "key": key})
    return Router(config, random.Random(0))


def _fleet(load: dict[str, int] | None = None) -> FleetSnapshot:
    load = load or {}
    return FleetSnapshot(
        tuple(InstanceState(i, load.get(i, 0) // 100, load.get(i, 0)) for i in IDS)
    )


def _affinity(**overrides: object) -> PrefixAffinityStrategy:
    strategy = build_strategy(strategy_config("prefix_affinity", **overrides), random.Random(0))
    assert isinstance(strategy, PrefixAffinityStrategy)
    strategy.on_instances_changed(IDS)
    return strategy


def _turn(n: int, session: str | None, tokens: int = 256) -> RoutingKey:
    """A prompt sharing nothing with any other turn (the prefix index cannot follow it)."""
    return key_from_blocks(
        tuple(range(10_000 * n, 10_000 * n + tokens // 16)),
        block_size=16,
        units=tokens,
        prompt_tokens=tokens,
        prefix_length=4096,
        seed=3,
        output_tokens_hint=16,
        session=session,
    )


# ------------------------------------------------------------------------------ the session id


def test_the_first_session_header_present_names_the_session() -> None:
    names = DEFAULT_SESSION_HEADERS
    assert names[0] == "x-warmfleet-session"
    assert session_from_headers({}, names) is None
    assert session_from_headers({"session_id": "codex", "x-session-id": "x"}, names) == "codex"
    both = {"x-warmfleet-session": "w", "x-claude-code-session-id": "claude"}
    assert session_from_headers(both, names) == "w"
    assert session_from_headers({"x-warmfleet-session": "", "x-session-id": "x"}, names) == "x"
    assert session_from_headers({"x-warmfleet-session": "w"}, ()) is None
    long = "s" * (MAX_SESSION_CHARS + 1)
    with pytest.raises(BadRequestError, match="x-session-id") as err:
        session_from_headers({"x-session-id": long}, names)
    assert err.value.param == "x-session-id"


def test_the_session_headers_are_configurable_and_checked() -> None:
    spec = KeySpec.model_validate({"sessionHeaders": ["X-My-Session", "conversation_id"]})
    assert spec.session_headers == ("x-my-session", "conversation_id")
    assert KeySpec().session_headers == DEFAULT_SESSION_HEADERS
    with pytest.raises(ValidationError, match=r"session_headers|sessionHeaders"):
        KeySpec.model_validate({"sessionHeaders": ["bad header"]})


def test_a_session_header_else_prompt_cache_key_is_the_session() -> None:
    assert parse_chat(_chat("hi")).session is None
    assert parse_chat(_chat("hi"), session="s1").session == "s1"
    keyed = parse_chat(_chat("hi", prompt_cache_key="pck"))
    assert (keyed.tenant, keyed.session) == ("pck", "pck")
    header_wins = parse_chat(_chat("hi", prompt_cache_key="pck"), session="s1")
    assert (header_wins.tenant, header_wins.session) == ("pck", "s1")
    # the tenant header alone names a tenant, not a session
    assert parse_chat(_chat("hi"), "tenant").session is None
    body = {"model": "m", "prompt": "hi", "prompt_cache_key": "p"}
    assert parse_completions(body).session == "p"
    assert parse_responses({"model": "m", "input": "hi"}, session="r").session == "r"
    assert parse_native(b"{}", None, "m", session="n").session == "n"


def test_the_session_is_hashed_under_the_keys_chain_seed() -> None:
    router = _router()
    plain = router.key(parse_chat(_chat("hello there")))
    one = router.key(parse_chat(_chat("hello there"), session="s1"))
    assert plain.session is None
    assert one.session is not None
    assert one.block_hashes == plain.block_hashes
    assert one.prefix_hash == plain.prefix_hash
    assert router.key(parse_chat(_chat("another prompt"), session="s1")).session == one.session
    assert router.key(parse_chat(_chat("hello there"), session="s2")).session != one.session
    # another deployment salt, another hash: no raw id, nothing comparable across deployments
    assert _router(salt="other").key(parse_chat(_chat("x"), session="s1")).session != one.session
    native = router.key(parse_native(b"raw body", None, "m", session="s1"))
    assert native.session == one.session  # same model, no tenant: same chain seed


# ------------------------------------------------------------------------------ the strategy


def test_a_session_goes_home_whatever_its_prompt() -> None:
    strategy = _affinity()
    first = strategy.choose(_turn(1, "s"), _fleet())
    strategy.on_routed(_turn(1, "s"), first)
    for n in range(2, 8):
        key = _turn(n, "s")
        decision = strategy.choose(key, _fleet())
        assert (decision.instance_id, decision.reason) == (first.instance_id, Reason.SESSION)
        strategy.on_routed(key, decision)
    # without the session the same prompts are placed as new groups, not all on one instance
    homes = set()
    for n in range(20, 40):
        decision = strategy.choose(_turn(n, None), _fleet())
        assert decision.reason is not Reason.SESSION
        strategy.on_routed(_turn(n, None), decision)
        homes.add(decision.instance_id)
    assert len(homes) > 1


def test_an_overloaded_home_is_left_and_the_session_moves() -> None:
    strategy = _affinity()
    first = strategy.choose(_turn(1, "s"), _fleet())
    strategy.on_routed(_turn(1, "s"), first)
    home = first.instance_id
    busy = _fleet({home: 50_000})
    moved = strategy.choose(_turn(2, "s"), busy)
    assert moved.instance_id != home
    assert moved.reason is not Reason.SESSION
    strategy.on_routed(_turn(2, "s"), moved)
    again = strategy.choose(_turn(3, "s"), _fleet())
    assert (again.instance_id, again.reason) == (moved.instance_id, Reason.SESSION)
    # a home that left the fleet is not chosen either
    gone = FleetSnapshot(tuple(InstanceState(i) for i in IDS if i != moved.instance_id))
    assert strategy.choose(_turn(4, "s"), gone).instance_id != moved.instance_id


def test_a_longer_strong_match_elsewhere_beats_the_sessions_home() -> None:
    """A client that sends one ``prompt_cache_key`` for all its traffic does not drag a prompt
    held elsewhere to its session's instance: a strong match the home lacks wins."""
    strategy = _affinity()
    first = strategy.choose(_turn(1, "s"), _fleet())
    strategy.on_routed(_turn(1, "s"), first)
    other = next(i for i in IDS if i != first.instance_id)
    held = _turn(2, None)
    strategy.on_routed(held, Decision(other, Reason.NO_MATCH))
    same_prompt = replace(held, session=_turn(3, "s").session)
    decision = strategy.choose(same_prompt, _fleet())
    assert (decision.instance_id, decision.reason) == (other, Reason.PREFIX_HIT)
    strategy.on_routed(same_prompt, decision)
    assert strategy.choose(_turn(4, "s"), _fleet()).instance_id == other  # the session moved
    # a weak match elsewhere (under min_match_fraction of the prompt) does not
    longer = key_from_blocks(
        (*held.block_hashes[:2], *range(900_000, 900_030)), block_size=16, units=512,
        prompt_tokens=512, prefix_length=4096, seed=3, session="s",
    )  # fmt: skip
    strategy.on_routed(_turn(5, "s"), Decision(first.instance_id, Reason.SESSION))
    assert strategy.choose(longer, _fleet()).reason is Reason.SESSION


def test_peers_learn_a_sessions_home_from_the_routed_note() -> None:
    views = [ReplicaView(f"r{r}", "v", _affinity()) for r in range(3)]
    for view in views:
        view.on_instances_changed(IDS)
    key = _turn(1, "s")
    decision = views[0].strategy.choose(key, _fleet())
    note = views[0].routed(key, decision)
    for view in views[1:]:
        assert view.apply(note)
        chosen = view.strategy.choose(_turn(2, "s"), _fleet())
        assert (chosen.instance_id, chosen.reason) == (decision.instance_id, Reason.SESSION)
    fresh = _affinity()
    fresh.adopt(views[1].strategy)
    assert fresh.choose(_turn(3, "s"), _fleet()).reason is Reason.SESSION


def test_replicas_that_never_heard_of_a_session_place_its_turns_alike_by_hash() -> None:
    """``session_placement: hash``: a session's cold start goes to the first instance of its
    session's hash order among the least loaded, so a replica that the first turn's note never
    reached (no sync, a partition) places the next turns on the same instance, whatever each
    replica placed before; with the default (``groups``) sessions rotate as any cold start."""
    replicas = [_affinity(session_placement="hash") for _ in range(3)]
    homes: Counter[str] = Counter()
    for s in range(40):
        first_key = _turn(3 * s, f"s{s}")
        first = replicas[0].choose(first_key, _fleet())
        replicas[0].on_routed(first_key, first)
        assert first.reason is Reason.NO_MATCH
        for r, other in enumerate(replicas[1:], start=1):
            turn_key = _turn(3 * s + r, f"s{s}")
            turn = other.choose(turn_key, _fleet())
            assert turn.instance_id == first.instance_id, (s, r)
            other.on_routed(turn_key, turn)
        homes[first.instance_id] += 1
    assert set(homes) == set(IDS)  # sessions spread over the fleet
    busy = _fleet({IDS[0]: 50_000})  # a busy instance is out of the band
    for s in range(40, 60):
        assert replicas[0].choose(_turn(3 * s, f"s{s}"), busy).instance_id != IDS[0]
    rotating = _affinity()
    placed = []
    for s in range(len(IDS)):
        decision = rotating.choose(_turn(s, f"s{s}"), _fleet())
        rotating.on_routed(_turn(s, f"s{s}"), decision)
        placed.append(decision.instance_id)
    assert sorted(placed) == sorted(IDS)


def test_session_homes_are_a_bounded_lru() -> None:
    homes = SessionHomes(entries=2)
    homes.learn(1, "a")
    homes.learn(2, "b")
    homes.learn(1, "c")  # refreshed: 2 is now the oldest
    homes.learn(3, "d")
    assert (homes.get(1), homes.get(2), homes.get(3), len(homes)) == ("c", None, "d", 2)
    with pytest.raises(ValueError, match="entries"):
        SessionHomes(entries=0)


def test_other_strategies_ignore_the_session() -> None:
    for name in ("prefix_hash", "least_outstanding_requests", "round_robin"):
        strategy = build_strategy(strategy_config(name), random.Random(0))
        strategy.on_instances_changed(IDS)
        with_session = strategy.choose(_turn(1, "s"), _fleet())
        again = build_strategy(strategy_config(name), random.Random(0))
        again.on_instances_changed(IDS)
        assert again.choose(_turn(1, None), _fleet()) == with_session
