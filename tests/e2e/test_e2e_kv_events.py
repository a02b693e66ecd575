"""KV-event decoding, engine->router hash translation, gap handling and the gateway hook."""

from __future__ import annotations

import asyncio
import random

import msgpack
import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from warmfleet.bench.live_procs import free_port
from warmfleet.core.types import FleetSnapshot, InstanceState, Reason
from warmfleet.gateway.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecodeError,
    KvEventFeed,
    KvEventRelay,
    KvEventSubscriber,
    KvEventTranslator,
    decode_frames,
    encode_frames,
    router_block_hashes,
)
from warmfleet.routing.config import PrefixAffinityConfig, RoutingConfig
from warmfleet.routing.exact_index import ExactPrefixIndex
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec

BS = 4
SEED = 12345


def vllm_frame(seq: int, events: list[dict[str, object]], topic: str = "kv.vllm-0") -> list[bytes]:
    """A frame laid out exactly as vLLM 0.32's ZMQ publisher sends it (tagged maps)."""
    payload = msgpack.packb([1795956057.85, events, 0])
    return [topic.encode(), seq.to_bytes(8, "big"), payload]


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> EventBatch:
    return EventBatch(0.0, tuple(events))


def block(engine_hashes: tuple[int, ...], parent: int | None, tokens: range) -> BlockStored:
    return BlockStored(engine_hashes, parent, tuple(tokens), BS)


# ------------------------------------------------------------------------------ decoding


def test_decode_vllm_frame_with_extra_fields() -> None:
    frames = vllm_frame(
        7,
        [
            stored([11, 12], None, list(range(8))),
            {"type": "BlockRemoved", "block_hashes": [b"\x01\x02"], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ],
    )
    topic, seq, decoded = decode_frames(frames)
    assert (topic, seq, decoded.data_parallel_rank) == ("kv.vllm-0", 7, 0)
    first, second, third = decoded.events
    assert first == BlockStored(
        (11, 12), None, tuple(range(8)), BS, None, "GPU", group_idx=0,
        kv_cache_spec_kind="full_attention",
    )  # fmt: skip
    assert second == BlockRemoved((b"\x01\x02",), "GPU")
    assert third == AllBlocksCleared()


def test_decode_array_form_and_roundtrip() -> None:
    payload = msgpack.packb([1.0, [["BlockStored", [5], 4, [1, 2, 3, 4], BS, None, None]]])
    _topic, _seq, decoded = decode_frames([b"kv.a", (3).to_bytes(8, "big"), payload])
    assert decoded.events == (BlockStored((5,), 4, (1, 2, 3, 4), BS),)
    again = decode_frames(encode_frames("kv.a", 3, decoded))
    assert again == ("kv.a", 3, decoded)


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv.a", b"\x00" * 8],
        [b"kv.a", b"\x00" * 4, msgpack.packb([1.0, []])],
        [b"kv.a", b"\x00" * 8, b"\xc1"],
        [b"kv.a", b"\x00" * 8, msgpack.packb({"ts": 1.0})],
        [b"kv.a", b"\x00" * 8, msgpack.packb([1.0, [{"type": "Nope"}]])],
        [b"kv.a", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockStored"}]])],
        [
            b"kv.a",
            b"\x00" * 8,
            msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]),
        ],
    ],
)
def test_decode_rejects_malformed(frames: list[bytes]) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_frames(frames)


# --------------------------------------------------------------------------- translation


def test_router_hashes_equal_key_builder_chain() -> None:
    keys = key_builder(KeySpec(mode="tokens", block_size=BS), tokenizer=_NullTokenizer())
    tokens = list(range(100, 111))  # 2 full blocks + 3 tokens
    key = keys.from_token_ids(tokens, SEED, 0, BS)
    assert router_block_hashes(tokens, BS, SEED) == list(key.block_hashes)
    head = router_block_hashes(tokens[:BS], BS, SEED)
    assert router_block_hashes(tokens[BS : 2 * BS], BS, head[0]) == list(key.block_hashes[1:])


class _NullTokenizer:
    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def encode_chat(
        self, messages: object, *, tools: object = None, options: object = None
    ) -> list[int]:
        return []


def make() -> tuple[ExactPrefixIndex, KvEventTranslator]:
    index = ExactPrefixIndex()
    return index, KvEventTranslator(index, SEED, BS, resync_batches=2, silence_timeout_s=5.0)


def test_stored_chain_across_batches_and_removal() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(block((1, 2), None, range(8))), 0.0)
    tr.apply("a", 1, batch(block((3,), 2, range(8, 12))), 0.0)
    expected = router_block_hashes(list(range(12)), BS, SEED)
    assert tr.mode("a") == "exact"
    assert index.match(expected) == {"a": 3}
    tr.apply("a", 2, batch(BlockRemoved((3,))), 0.0)
    assert index.match(expected) == {"a": 2}


def test_gap_falls_back_then_resyncs_on_clear() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(block((1,), None, range(4))), 0.0)
    assert index.knows("a")
    tr.apply("a", 5, batch(), 1.0)  # batches 1..4 lost
    assert tr.mode("a") == "approximate"
    assert not index.knows("a")  # prefix_affinity uses its approximate index for "a"
    assert tr.stats.gaps == 1
    tr.apply("a", 6, batch(AllBlocksCleared(), block((9,), None, range(4))), 2.0)
    assert tr.mode("a") == "exact"
    assert index.match(router_block_hashes(list(range(4)), BS, SEED)) == {"a": 1}


def test_late_joiner_resyncs_after_clean_batches_with_a_subset() -> None:
    index, tr = make()
    tr.apply("a", 40, batch(block((7,), 99, range(4, 8))), 0.0)  # unknown parent
    assert tr.mode("a") == "approximate"
    assert (tr.stats.late_joins, tr.stats.gaps, tr.stats.untranslatable_blocks) == (1, 0, 1)
    tr.apply("a", 41, batch(block((1,), None, range(4))), 0.0)
    assert tr.mode("a") == "approximate"  # one clean batch of two
    tr.apply("a", 42, batch(block((2,), 1, range(4, 8))), 0.0)
    assert tr.mode("a") == "exact"
    assert index.match(router_block_hashes(list(range(8)), BS, SEED)) == {"a": 2}


def test_engine_restart_starts_a_fresh_exact_view() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(block((1,), None, range(4))), 0.0)
    tr.apply("a", 1, batch(block((2,), 1, range(4, 8))), 0.0)
    tr.apply("a", 0, batch(block((5,), None, range(8, 12))), 0.0)  # restarted: seq again 0
    assert tr.mode("a") == "exact"
    assert index.match(router_block_hashes(list(range(8)), BS, SEED)) == {}
    assert index.match(router_block_hashes(list(range(8, 12)), BS, SEED)) == {"a": 1}


def test_block_size_mismatch_is_approximate() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(BlockStored((1,), None, tuple(range(16)), 16)), 0.0)
    assert tr.mode("a") == "approximate"
    assert "block size" in tr.describe()["instances"]["a"]["cause"]
    assert not index.knows("a")


def test_silence_after_a_routed_request_falls_back() -> None:
    index, tr = make()
    tr.apply("a", 0, batch(), 0.0)
    tr.expect_events("a", 10.0)
    assert tr.check_silence(14.0) == []
    tr.apply("a", 1, batch(), 14.5)  # the batch came: disarmed
    assert tr.check_silence(100.0) == []
    tr.expect_events("a", 200.0)
    assert tr.check_silence(206.0) == ["a"]
    assert tr.mode("a") == "approximate"
    assert not index.knows("a")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3), st.booleans()), max_size=25))
def test_gap_free_stream_mirrors_engine_contents(ops: list[tuple[int, int, bool]]) -> None:
    """Without gaps the exact index holds exactly the router hashes of the blocks the engine
    holds (a toy engine: chains of blocks of token runs, stored and removed leaf first)."""
    index, tr = make()
    engine: dict[int, int] = {}  # engine hash -> router hash of blocks held
    chains: dict[int, list[int]] = {}
    for seq, (root, length, remove) in enumerate(ops):
        chain = chains.setdefault(root, [])
        if remove and chain:
            gone = chain.pop()
            tr.apply("a", seq, batch(BlockRemoved((gone,))), 0.0)
            engine.pop(gone)
        else:
            tokens = list(
                range(root * 1000 + len(chain) * BS, root * 1000 + (len(chain) + length) * BS)
            )
            parent = chain[-1] if chain else None
            hashes = tuple(hash((root, len(chain) + i)) & 0xFFFFFFFF for i in range(length))
            tr.apply("a", seq, batch(BlockStored(hashes, parent, tuple(tokens), BS)), 0.0)
            ours = router_block_hashes(
                list(range(root * 1000, root * 1000 + (len(chain) + length) * BS)), BS, SEED
            )[len(chain) :]
            engine.update(zip(hashes, ours, strict=True))
            chain.extend(hashes)
    assert tr.mode("a") == ("exact" if ops else "approximate")
    for h in engine.values():
        assert index.holders(h) == 1
    assert index.distinct_blocks == len(engine)


# ------------------------------------------------------------------------- gateway hook


def routing() -> RoutingConfig:
    return RoutingConfig(strategy=PrefixAffinityConfig(), key=KeySpec(mode="tokens", block_size=BS))


def test_feed_hooks_the_live_router_and_survives_a_reload() -> None:
    feed = KvEventFeed("m")
    factory = feed.router_factory(_NullTokenizer())
    throwaway = factory(routing(), random.Random(0))  # config validation: never activated
    live = factory(routing(), random.Random(1))
    live.on_instances_changed(["a", "b"])
    assert feed.translator is not None
    assert feed.translator.index is live.exact_index
    assert throwaway.exact_index is not live.exact_index
    seed = live.router.keys.seed("m", None, None)
    tokens = list(range(10))  # 2 full blocks, both held by b: a strong match
    feed.apply("b", 0, batch(block((1, 2), None, range(8))), 0.0)
    key = live.router.keys.from_token_ids(tokens, seed, 0, BS)
    fleet = FleetSnapshot((InstanceState("a"), InstanceState("b")))
    assert live.choose(key, fleet).instance_id == "b"
    assert feed.modes() == {"a": "approximate", "b": "exact"}  # a: routed, no events yet
    registry = CollectorRegistry()
    feed.register_metrics(registry)
    text = generate_latest(registry).decode()
    assert 'warmfleet_gateway_kv_events_exact{instance_id="b"} 1.0' in text
    reloaded = factory(routing(), random.Random(2))
    reloaded.on_instances_changed(["a", "b"])
    assert reloaded.choose(key, fleet).instance_id == "b"  # the view moved to the new router


def test_the_feed_stays_on_the_router_in_service() -> None:
    """A router is bound to the feed's chains when it is built; only going into service
    (``on_instances_changed``) moves the feed to it. A replaced router that an in-flight request
    still holds (a retry's ``choose``) does not take the feed back."""
    feed = KvEventFeed("m")
    factory = feed.router_factory(_NullTokenizer())
    old = factory(routing(), random.Random(1))
    assert old.exact_index is not None
    assert old.exact_index.chain_seed == old.chain_seed == old.router.keys.seed("m", None, None)
    old.on_instances_changed(["a", "b"])
    new = factory(routing(), random.Random(2))
    new.adopt(old)
    new.on_instances_changed(["a", "b"])
    translator = feed.translator
    assert translator is not None
    assert translator.index is new.exact_index
    key = old.router.keys.from_token_ids(list(range(2 * BS)), old.chain_seed, 0, BS)
    old.choose(key, FleetSnapshot((InstanceState("a"), InstanceState("b"))))
    assert feed.translator is translator
    assert translator.index is new.exact_index


@pytest.mark.parametrize("other", ["tenant", "adapter", "alias"])
def test_keys_chained_from_another_start_keep_their_affinity_in_exact_mode(other: str) -> None:
    """Regression: the exact view is chained from (model, no adapter, no tenant). A tenant's
    (or adapter's, or model alias's) key names other hashes for the same tokens, so on exact
    instances it never matched and every such request was routed as new. Such keys now use
    the approximate index, and do not arm the silence check (the engine may already hold their
    tokens under its shared hashes and publish nothing)."""
    now = [0.0]
    feed = KvEventFeed("m", silence_timeout_s=5.0, clock=lambda: now[0])
    live = feed.router_factory(_NullTokenizer())(routing(), random.Random(1))
    live.on_instances_changed(["a", "b"])
    for iid in ("a", "b"):  # both exact, holding an unrelated block
        feed.apply(iid, 0, batch(block((7,), None, range(50, 54))), 0.0)
    keys = live.router.keys
    seed = {
        "tenant": keys.seed("m", None, "t1"),
        "adapter": keys.seed("m", "lora-1", None),
        "alias": keys.seed("m-alias", None, None),
    }[other]
    key = keys.from_token_ids(list(range(12)), seed, 0, BS)
    fleet = FleetSnapshot((InstanceState("a"), InstanceState("b")))
    first = live.choose(key, fleet)
    live.on_routed(key, first)
    again = live.choose(key, fleet)
    assert again.instance_id == first.instance_id
    assert again.reason is Reason.PREFIX_HIT
    now[0] = 60.0
    assert feed.check_silence(now[0]) == []
    assert feed.modes() == {"a": "exact", "b": "exact"}
    # a key chained like the engine's view still goes by the exact index (nothing held: new)
    plain = keys.from_token_ids(list(range(12)), keys.seed("m", None, None), 0, BS)
    assert live.choose(plain, fleet).reason is not Reason.PREFIX_HIT


# ------------------------------------------------------------------------------ sockets


async def _until(predicate: object, send: object, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "no frames arrived"
        await send()  # type: ignore[operator]
        await asyncio.sleep(0.05)


async def test_subscriber_binds_and_relay_fans_out() -> None:
    engines = f"tcp://127.0.0.1:{free_port()}"
    replicas = f"tcp://127.0.0.1:{free_port()}"
    relay = KvEventRelay(engines, replicas)
    translators = [make() for _ in range(2)]
    subs = [KvEventSubscriber(tr, replicas, bind=False) for _index, tr in translators]
    servers: list[KvEventRelay | KvEventSubscriber] = [relay, *subs]
    tasks = [asyncio.create_task(s.run()) for s in servers]
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(engines)  # as vLLM does with a concrete host
    sent = 0

    async def send() -> None:
        nonlocal sent
        await pub.send_multipart(vllm_frame(sent, [{"type": "AllBlocksCleared"}]))
        sent += 1

    try:
        await _until(lambda: all(tr.stats.batches for _i, tr in translators), send)
        await pub.send_multipart([b"kv.vllm-0", b"\x00", b"junk"])
        await _until(lambda: all(s.decode_errors for s in subs), lambda: asyncio.sleep(0))
        for _index, tr in translators:
            assert tr.mode("vllm-0") == "exact"
    finally:
        pub.close(linger=0)
        ctx.term()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
