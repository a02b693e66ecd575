"""KV events as vLLM 0.32 really sends them beyond the simple case: malformed payloads, offload
tiers (``medium``), LoRA and extra-key blocks; a silence that lost nothing; topics that name no
routed instance."""

from __future__ import annotations

import msgpack
import pytest

from warmfleet.gateway.kv_events import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecodeError,
    KvEventSubscriber,
    KvEventTranslator,
    decode_frames,
    router_block_hashes,
)
from warmfleet.gateway.kv_events import view as view_module
from warmfleet.gateway.kv_events.translator import MAX_UNROUTED_VIEWS
from warmfleet.gateway.kv_events.view import ReplayRequest
from warmfleet.routing.exact_index import ExactPrefixIndex

BS = 4
SEED = 12345


def frame(payload: bytes, seq: int = 0) -> list[bytes]:
    return [b"kv.a", seq.to_bytes(8, "big"), payload]


def stored_map(**fields: object) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
    }
    event.update(fields)
    return event


MALFORMED = {
    "ts nil": msgpack.packb([None, []]),
    "ts string": msgpack.packb(["x", []]),
    "ts ext timestamp": msgpack.packb([msgpack.Timestamp(1, 0), []]),
    "a list as a map key": b"\x92\xcb" + b"\x00" * 8 + b"\x91\x81\x91\x01\x01",
    "block_size infinite": msgpack.packb([1.0, [stored_map(block_size=float("inf"))]]),
    "block_size nil": msgpack.packb([1.0, [stored_map(block_size=None)]]),
    "token id infinite": msgpack.packb([1.0, [stored_map(token_ids=[float("inf")] * 4)]]),
    "token id negative": msgpack.packb([1.0, [stored_map(token_ids=[-1, 2, 3, 4])]]),
    "token ids as bytes": msgpack.packb([1.0, [stored_map(token_ids=b"\x00" * 32)]]),
    "block hashes as bytes": msgpack.packb([1.0, [stored_map(block_hashes=b"\x01\x02")]]),
    "medium not a string": msgpack.packb([1.0, [stored_map(medium=3)]]),
}


@pytest.mark.parametrize("payload", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_payloads_are_decode_errors(payload: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_frames(frame(payload))


def make() -> tuple[ExactPrefixIndex, KvEventTranslator]:
    index = ExactPrefixIndex()
    return index, KvEventTranslator(index, SEED, BS, resync_batches=2, silence_timeout_s=5.0)


def batch(*events: BlockStored) -> EventBatch:
    return EventBatch(0.0, events)


def test_the_subscriber_survives_every_malformed_payload() -> None:
    _index, tr = make()
    sub = KvEventSubscriber(tr, "inproc://kv-edges-malformed")
    try:
        for payload in MALFORMED.values():
            sub.handle(frame(payload))
        assert sub.decode_errors == len(MALFORMED)
        sub.handle(frame(msgpack.packb([1.0, [stored_map()]])))
        assert tr.mode("a") == "exact"
    finally:
        sub.close()


class _Broken:
    def apply(self, instance_id: str, seq: int, batch: EventBatch, now_s: float) -> None:
        raise RuntimeError("a bug in the consumer")

    def check_silence(self, now_s: float) -> list[str]:
        return []

    def take_replay_requests(self) -> list[ReplayRequest]:
        return []

    def replay_steps(self, request: object, batches: object, now_s: float) -> object:
        return iter(())


def test_a_consumer_error_does_not_escape_the_subscriber() -> None:
    sub = KvEventSubscriber(_Broken(), "inproc://kv-edges-broken")  # type: ignore[arg-type]
    try:
        sub.handle(frame(msgpack.packb([1.0, [stored_map()]])))
        assert sub.apply_errors == 1
    finally:
        sub.close()


def test_the_subscriber_reports_how_late_each_stamped_batch_arrived() -> None:
    """Engine stamp to arrival, by the gateway's wall clock; an engine clock ahead reads 0, an
    unstamped (0) or non-finite stamp is not a delay."""
    delays: list[float] = []
    _index, tr = make()
    sub = KvEventSubscriber(
        tr, "inproc://kv-edges-delay", on_delay=delays.append, wall_clock=lambda: 1000.25
    )
    try:
        for ts in (1000.0, 999.0, 1001.0, 0.0, float("inf"), float("nan")):
            sub.handle(frame(msgpack.packb([ts, [stored_map()]])))
        assert delays == [0.25, 1.25, 0.0]
    finally:
        sub.close()


# ------------------------------------------------------------------------------ offload tiers


def test_offload_tier_events_leave_the_gpu_view_alone() -> None:
    """vLLM's offloading connector publishes CPU-tier stores (placeholders: block_size 0, no
    tokens) and removals with the GPU blocks' hashes."""
    index, tr = make()
    chain = router_block_hashes(list(range(8)), BS, SEED)
    tr.apply("a", 0, EventBatch(0.0, (BlockStored((1, 2), None, tuple(range(8)), BS),)), 0.0)
    cpu_store = BlockStored((1,), None, (), 0, medium="CPU")
    tr.apply("a", 1, EventBatch(0.0, (cpu_store,)), 0.0)
    assert tr.mode("a") == "exact"
    tr.apply("a", 2, EventBatch(0.0, (BlockRemoved((1, 2), "CPU"),)), 0.0)
    assert index.match(chain) == {"a": 2}  # still on the GPU
    # and a child of a block whose CPU copy went away still translates
    tr.apply("a", 3, EventBatch(0.0, (BlockStored((3,), 2, tuple(range(8, 12)), BS),)), 0.0)
    assert index.match(router_block_hashes(list(range(12)), BS, SEED)) == {"a": 3}
    assert tr.mode("a") == "exact"
    assert tr.stats.other_tier_events == 2
    tr.apply("a", 4, EventBatch(0.0, (BlockRemoved((3,), "GPU"),)), 0.0)
    assert index.match(router_block_hashes(list(range(12)), BS, SEED)) == {"a": 2}


# ------------------------------------------------------------------------ hybrid KV groups


def hybrid_store(
    hashes: tuple[int, ...], parent: int | None, tokens: range, group: int, kind: str, bs: int = BS
) -> BlockStored:
    return BlockStored(
        hashes, parent, tuple(tokens), bs, medium="GPU", group_idx=group, kv_cache_spec_kind=kind
    )


def test_a_hybrid_models_other_kv_groups_leave_the_full_attention_view_alone() -> None:
    """A hybrid model (here group 0 sliding window, group 1 full attention, group 2 Mamba with
    its own block size) reports each block once per group. The full-attention group is
    followed: a sliding-window eviction must not drop a prefix still held for full attention,
    and another group's block size is not a mismatch. Group 0 was followed until group 1
    showed up, so the instance resyncs first (approximate for ``resync_batches``)."""
    index, tr = make()
    chain = router_block_hashes(list(range(8)), BS, SEED)
    tr.apply("a", 0, EventBatch(0.0, (
        hybrid_store((1, 2), None, range(8), 0, "sliding_window"),
        hybrid_store((1, 2), None, range(8), 1, "full_attention"),
        hybrid_store((9,), None, range(16), 2, "mamba", bs=16),
    )), 0.0)  # fmt: skip
    assert tr.mode("a") == "approximate"
    assert tr.describe()["instances"]["a"]["cause"] == "KV cache group 1 followed"
    tr.apply("a", 1, EventBatch(0.0, (BlockRemoved((1, 2), "GPU", group_idx=0),)), 0.0)
    assert tr.mode("a") == "exact"
    assert index.match(chain) == {"a": 2}  # still held for full attention
    tr.apply("a", 2, EventBatch(0.0, (BlockRemoved((2,), "GPU", group_idx=1),)), 0.0)
    assert index.match(chain) == {"a": 1}
    assert tr.stats.other_group_events == 2
    assert tr.stats.block_size_mismatches == 0
    assert tr.describe()["instances"]["a"]["kv_cache_group"] == 1


def test_full_attention_in_group_0_is_followed_from_the_start() -> None:
    index, tr = make()
    chain = router_block_hashes(list(range(8)), BS, SEED)
    tr.apply("a", 0, EventBatch(0.0, (
        hybrid_store((1, 2), None, range(8), 0, "full_attention"),
        hybrid_store((1, 2), None, range(8), 1, "sliding_window"),
    )), 0.0)  # fmt: skip
    assert tr.mode("a") == "exact"
    tr.apply("a", 1, EventBatch(0.0, (BlockRemoved((2,), "GPU", group_idx=1),)), 0.0)
    assert index.match(chain) == {"a": 2}


def test_a_model_of_one_sliding_window_group_is_followed() -> None:
    """No full-attention group at all (every layer sliding window): group 0 stands for it."""
    index, tr = make()
    chain = router_block_hashes(list(range(8)), BS, SEED)
    store = hybrid_store((1, 2), None, range(8), 0, "sliding_window")
    tr.apply("a", 0, EventBatch(0.0, (store,)), 0.0)
    assert tr.mode("a") == "exact"
    assert index.match(chain) == {"a": 2}
    tr.apply("a", 1, EventBatch(0.0, (BlockRemoved((2,), "GPU", group_idx=0),)), 0.0)
    assert index.match(chain) == {"a": 1}
    assert tr.stats.other_group_events == 0


def test_groups_without_kinds_follow_group_0_and_no_group_means_all() -> None:
    """An engine that names groups but not their kinds: group 0 stands for it. Events with no
    group at all (older vLLM, one KV cache group) are all followed."""
    index, tr = make()
    chain = router_block_hashes(list(range(8)), BS, SEED)
    grouped = BlockStored((1, 2), None, tuple(range(8)), BS, medium="GPU", group_idx=0)
    other = BlockStored((5, 6), None, tuple(range(8)), BS, medium="GPU", group_idx=1)
    tr.apply("a", 0, EventBatch(0.0, (grouped, other)), 0.0)
    tr.apply("a", 1, EventBatch(0.0, (BlockRemoved((5, 6), "GPU", group_idx=1),)), 0.0)
    assert index.match(chain) == {"a": 2}
    tr.apply("a", 2, EventBatch(0.0, (BlockRemoved((2,), "GPU"),)), 0.0)  # no group: followed
    assert index.match(chain) == {"a": 1}
    assert tr.stats.other_group_events == 2


def test_hybrid_group_fields_decode_from_vllm_maps_and_arrays() -> None:
    removed = {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 2}
    store = stored_map(group_idx=1, kv_cache_spec_kind="sliding_window")
    _topic, _seq, batch = decode_frames(frame(msgpack.packb([1.0, [store, removed]])))
    assert batch.events == (
        BlockStored((1,), None, (1, 2, 3, 4), BS, None, "GPU", group_idx=1,
                    kv_cache_spec_kind="sliding_window"),
        BlockRemoved((1,), "GPU", 2),
    )  # fmt: skip
    array_form = ["BlockRemoved", [1], "GPU", 3]
    _topic, _seq, batch = decode_frames(frame(msgpack.packb([1.0, [array_form]])))
    assert batch.events == (BlockRemoved((1,), "GPU", 3),)
    with pytest.raises(KvEventDecodeError, match="group_idx"):
        decode_frames(frame(msgpack.packb([1.0, [stored_map(group_idx="1")]])))


# ------------------------------------------------------------------------- LoRA / extra keys


def test_lora_blocks_are_never_predicted_for_base_model_prompts() -> None:
    index, tr = make()
    tokens = tuple(range(8))
    lora = BlockStored((1, 2), None, tokens, BS, lora_id=1, lora_name="adapter")
    tr.apply("a", 0, EventBatch(0.0, (lora,)), 0.0)
    assert index.match(router_block_hashes(list(tokens), BS, SEED)) == {}
    # its children are the adapter's too, and an unknown parent it is not
    tr.apply("a", 1, EventBatch(0.0, (BlockStored((3,), 2, tuple(range(8, 12)), BS),)), 0.0)
    assert tr.mode("a") == "exact"
    assert index.match(router_block_hashes(list(range(12)), BS, SEED)) == {}
    assert tr.stats.foreign_blocks == 3
    # the base model's own copy of the same tokens is indexed
    tr.apply("a", 2, EventBatch(0.0, (BlockStored((7, 8), None, tokens, BS),)), 0.0)
    assert index.match(router_block_hashes(list(tokens), BS, SEED)) == {"a": 2}
    tr.apply("a", 3, EventBatch(0.0, (BlockRemoved((1, 2, 3)),)), 0.0)
    assert index.match(router_block_hashes(list(tokens), BS, SEED)) == {"a": 2}
    view = tr.describe()["instances"]["a"]
    assert (view["held_blocks"], view["translations"]) == (2, 2)  # the adapter's are gone


def test_translations_left_behind_by_gaps_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removals lost in a gap leave translations nobody will pop; past the bound the oldest
    go, and the blocks the engine is known to hold stay matched."""
    monkeypatch.setattr(view_module, "UNTRACKED_TRANSLATIONS", 8)
    index, tr = make()
    seq = 0
    for cycle in range(10):
        first = 100 * cycle + 1
        hashes = tuple(range(first, first + 10))  # 10 one-block prompts of their own
        stores = tuple(BlockStored((h,), None, tuple(range(4 * h, 4 * h + 4)), BS) for h in hashes)
        tr.apply("a", seq, EventBatch(0.0, stores), 0.0)
        seq += 2  # the next batch, with their removal, is lost
    described = tr.describe()["instances"]["a"]
    # 10 held (the last cycle's); untracked kept within 2 x the peak held (10) + slack
    assert described["held_blocks"] == 10
    assert described["translations"] <= 10 + 2 * 10
    assert tr.stats.pruned_translations >= 90 - 2 * 10
    assert tr.stats.gaps == 9
    tr.apply("a", seq - 1, EventBatch(0.0, ()), 0.0)
    assert tr.mode("a") == "exact"  # resynced: the last cycle's blocks are in the index
    last = router_block_hashes(list(range(4 * 901, 4 * 901 + 4)), BS, SEED)
    assert index.match(last) == {"a": 1}


def test_extra_keys_cut_the_chain_where_they_start() -> None:
    """A multimodal block (or a cache salt) hashes more than its tokens: the router's key of
    the same placeholder tokens names another block."""
    index, tr = make()
    tokens = list(range(12))
    event = {
        **stored_map(block_hashes=[1, 2, 3], token_ids=tokens),
        "lora_name": None,
        "extra_keys": [None, [["mm-sha", 0]], None],
    }
    _topic, _seq, decoded = decode_frames(frame(msgpack.packb([1.0, [event], 0])))
    tr.apply("a", 0, decoded, 0.0)
    assert index.match(router_block_hashes(tokens, BS, SEED)) == {"a": 1}
    assert tr.stats.foreign_blocks == 2


def test_decoding_keeps_lora_name_and_extra_keys() -> None:
    event = {**stored_map(block_hashes=[1, 2], token_ids=list(range(8)))}
    event.update(lora_id=3, lora_name="adapter", extra_keys=[["adapter"], ["adapter"]])
    _topic, _seq, decoded = decode_frames(frame(msgpack.packb([1.0, [event], 0])))
    (got,) = decoded.events
    assert isinstance(got, BlockStored)
    assert (got.lora_id, got.lora_name, got.extra_keys) == (3, "adapter", (["adapter"],) * 2)
    plain = {**stored_map(), "lora_name": None, "extra_keys": [None]}
    _topic, _seq, decoded = decode_frames(frame(msgpack.packb([1.0, [plain], 0])))
    assert decoded.events == (BlockStored((1,), None, (1, 2, 3, 4), BS, None, "GPU"),)


def test_a_silence_keeps_the_view_and_the_next_batch_in_sequence_restores_it() -> None:
    """A routed request that stored nothing (refused, cancelled, already cached) is no loss:
    the engine never reports a held prefix again, so its view is kept whole and the next batch
    in sequence brings the instance back to exact with it; a gap after a silence clears it."""
    index, tr = make()
    system = list(range(100, 108))  # two blocks stored once, hit ever after
    tr.apply("a", 0, batch(BlockStored((11, 12), None, tuple(system), BS)), 0.0)
    whole = router_block_hashes(system, BS, SEED)
    tr.expect_events("a", 1.0)
    assert tr.check_silence(12.0) == ["a"]
    assert tr.mode("a") == "approximate"
    assert not index.knows("a")
    turn = [201] * BS
    tr.apply("a", 1, batch(BlockStored((21,), 12, tuple(turn), BS)), 13.0)
    assert tr.mode("a") == "exact"
    assert index.match(router_block_hashes(system + turn, BS, SEED)) == {"a": 3}
    tr.expect_events("a", 20.0)
    tr.check_silence(31.0)
    tr.apply("a", 3, batch(BlockStored((22,), 12, tuple(turn), BS)), 32.0)  # batch 2 lost
    assert tr.mode("a") == "approximate"
    assert tr.describe()["instances"]["a"]["held_blocks"] == 1  # only what came after the gap
    assert index.match(whole) == {}


def test_topics_of_no_routed_instance_are_followed_up_to_a_bound() -> None:
    """One another replica routes to before this one discovers it is followed (and kept if it
    joins the fleet); past MAX_UNROUTED_VIEWS such topics, batches are ignored and counted."""
    _, tr = make()
    tr.retain(["a"])
    for n in range(MAX_UNROUTED_VIEWS + 5):
        tr.apply(f"stray-{n}", 0, batch(BlockStored((n + 1,), None, tuple(range(4)), BS)), 0.0)
    assert len(tr.modes()) == MAX_UNROUTED_VIEWS
    assert tr.stats.unrouted_batches == 5
    tr.apply("a", 0, batch(), 0.0)  # a routed instance is always followed
    assert tr.mode("a") == "exact"
    tr.retain(["a", "stray-0"])  # discovered now: its view goes on
    assert set(tr.modes()) == {"a", "stray-0"}
    assert tr.mode("stray-0") == "exact"
