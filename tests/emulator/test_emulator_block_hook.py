"""The engine's optional block listener (the KV-event hook): it mirrors the cache exactly."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from support.engines import engine_spec
from warmfleet.engine.events import EngineRequest
from warmfleet.engine.model import EngineModel

SPEC = engine_spec(
    name="hook",
    block_tokens=4,
    kv_capacity_tokens=24 * 4,
    max_num_seqs=4,
    max_num_batched_tokens=32,
    max_model_len=131_072,
    prefill_s_per_token=1e-4,
    prefill_attn_s_per_token_pair=0.0,
    decode_s_per_seq=0.0,
    kv_read_s_per_token=0.0,
)


class Recorder:
    def __init__(self) -> None:
        self.cached: set[int] = set()
        self.stored = 0
        self.removed = 0

    def block_stored(self, block_hash: int) -> None:
        assert block_hash not in self.cached
        self.cached.add(block_hash)
        self.stored += 1

    def blocks_removed(self, block_hashes: Sequence[int]) -> None:
        for block_hash in block_hashes:
            self.cached.remove(block_hash)
        self.removed += len(block_hashes)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 12), st.integers(1, 6)),
        min_size=1,
        max_size=25,
    ),
    st.booleans(),
)
def test_listener_sees_every_store_and_eviction(
    requests: list[tuple[int, int, int]], cache_when_scheduled: bool
) -> None:
    recorder = Recorder()
    engine = EngineModel(SPEC, block_listener=recorder, cache_when_scheduled=cache_when_scheduled)
    now_s = 0.0
    for rid, (group, blocks, output) in enumerate(requests):
        hashes = tuple(group * 1000 + i for i in range(blocks))
        engine.submit(EngineRequest(rid, hashes, blocks * 4 + 1, output), now_s)
        now_s += 0.005
        engine.advance(now_s)
    while (next_s := engine.next_event_s()) is not None:
        engine.advance(next_s)
    stats = engine.stats()
    assert len(recorder.cached) == stats.cached_blocks
    for block_hash in recorder.cached:
        assert engine.cached_prefix_blocks([block_hash]) == 1
    assert recorder.stored - recorder.removed == stats.cached_blocks
    assert recorder.stored > 0


def test_without_listener_nothing_changes() -> None:
    a, b = EngineModel(SPEC), EngineModel(SPEC, block_listener=Recorder())
    for engine in (a, b):
        engine.submit(EngineRequest(1, (1, 2, 3), 13, 3), 0.0)
        while (next_s := engine.next_event_s()) is not None:
            engine.advance(next_s)
    assert a.stats() == b.stats()
