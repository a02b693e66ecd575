"""Engine model behaviour: prefix cache, LRU + refcounts, batching, chunked prefill, timing."""

from __future__ import annotations

import itertools

import pytest

from support.engines import BLOCK_TOKENS, engine_spec
from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest
from warmfleet.engine.model import EngineModel
from warmfleet.engine.presets import get_preset, preset_names

BT = BLOCK_TOKENS


def req(rid: int, blocks: list[int], extra_tokens: int = 0, output: int = 4) -> EngineRequest:
    return EngineRequest(rid, tuple(blocks), len(blocks) * BT + extra_tokens, output)


def run_all(engine: EngineModel) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while (at_s := engine.next_event_s()) is not None:
        events.extend(engine.advance(at_s))
        engine.check_invariants()
    return events


def first_token(events: list[EngineEvent], rid: int) -> EngineEvent:
    return next(e for e in events if e.request_id == rid and e.kind == EngineEventKind.FIRST_TOKEN)


def finished(events: list[EngineEvent], rid: int) -> EngineEvent:
    return next(e for e in events if e.request_id == rid and e.kind == EngineEventKind.FINISHED)


def test_prefix_hit_is_served_from_cache_and_is_faster() -> None:
    engine = EngineModel(engine_spec())
    engine.submit(req(1, [1, 2, 3, 4], extra_tokens=5), 0.0)
    cold = run_all(engine)
    start_s = finished(cold, 1).time_s
    engine.submit(req(2, [1, 2, 3, 9], extra_tokens=5), start_s)
    warm = run_all(engine)
    hit = first_token(warm, 2)
    assert hit.cached_tokens == 3 * BT
    assert first_token(cold, 1).cached_tokens == 0
    assert hit.time_s - start_s < first_token(cold, 1).time_s
    stats = engine.stats()
    assert stats.prefix_cache_queries_tokens == 2 * (4 * BT + 5)
    assert stats.prefix_cache_hits_tokens == 3 * BT


def test_identical_prompt_recomputes_at_least_one_token() -> None:
    engine = EngineModel(engine_spec())
    engine.submit(req(1, [1, 2, 3]), 0.0)
    run_all(engine)
    engine.submit(req(2, [1, 2, 3]), 10.0)
    assert first_token(run_all(engine), 2).cached_tokens == 2 * BT


def test_lru_evicts_least_recently_released_and_deepest_block_first() -> None:
    # 10 blocks; a request holds its 4 prompt blocks + 1 output block while running
    engine = EngineModel(engine_spec(kv_capacity_tokens=10 * BT))
    engine.submit(req(1, [11, 12, 13, 14], output=1), 0.0)
    run_all(engine)
    engine.submit(req(2, [21, 22, 23, 24], output=1), 1.0)
    run_all(engine)
    assert engine.cached_prefix_blocks((11, 12, 13, 14)) == 4
    # 2 free blocks left; the newcomer needs 4 -> evicts 2 of request 1's (released first),
    # deepest first: 14 then 13
    engine.submit(req(3, [31, 32, 33], extra_tokens=10, output=3), 2.0)
    run_all(engine)
    assert engine.cached_prefix_blocks((21, 22, 23, 24)) == 4
    assert engine.cached_prefix_blocks((11, 12, 13, 14)) == 2
    engine.check_invariants()


def test_partial_eviction_keeps_the_root_of_a_chain() -> None:
    engine = EngineModel(engine_spec(kv_capacity_tokens=8 * BT))
    engine.submit(req(1, [11, 12, 13, 14], output=1), 0.0)
    run_all(engine)
    # 4 free blocks; the newcomer needs 5 -> exactly one eviction: block 14
    engine.submit(req(2, [21, 22, 23, 24], output=1), 1.0)
    run_all(engine)
    assert engine.cached_prefix_blocks((11, 12, 13, 14)) == 3


def test_running_requests_hold_their_blocks() -> None:
    engine = EngineModel(engine_spec(kv_capacity_tokens=8 * BT))
    engine.submit(req(1, [1, 2, 3], output=40), 0.0)  # 3 prompt + 3 output blocks
    engine.submit(req(2, [4, 5, 6], output=1), 0.001)  # needs 4 blocks, only 2 left
    events: list[EngineEvent] = []
    waited = False
    while (at_s := engine.next_event_s()) is not None:
        events.extend(engine.advance(at_s))
        engine.check_invariants()
        if engine.stats().running == 1 and engine.stats().waiting == 1:
            waited = True
            assert engine.cached_prefix_blocks((1, 2, 3)) == 3
    assert waited
    assert first_token(events, 2).time_s >= finished(events, 1).time_s


def test_max_num_seqs_bounds_the_batch() -> None:
    engine = EngineModel(engine_spec(max_num_seqs=2, kv_capacity_tokens=1024 * BT))
    for rid in range(5):
        engine.submit(req(rid, [100 + rid, 200 + rid], output=20), 0.0)
    seen_waiting = False
    while (at_s := engine.next_event_s()) is not None:
        engine.advance(at_s)
        stats = engine.stats()
        assert stats.running <= 2
        seen_waiting = seen_waiting or stats.waiting > 0
    assert seen_waiting


def test_chunked_prefill_matches_the_idle_prefill_time() -> None:
    spec = engine_spec(kv_capacity_tokens=1024 * BT, max_num_batched_tokens=100)
    engine = EngineModel(spec)
    request = EngineRequest(1, tuple(range(20)), 20 * BT + 7, 2)
    engine.submit(request, 0.0)
    event = first_token(run_all(engine), 1)
    assert event.time_s == pytest.approx(spec.prefill_s(request.prompt_tokens))
    # ceil(327 / 100) = 4 chunks: more than a single step would take
    assert event.time_s > spec.step_overhead_s + 327 * spec.prefill_s_per_token


def test_prefill_cost_per_token_grows_with_context() -> None:
    spec = get_preset("llama-3.1-70b-p5")
    assert spec.prefill_s(32_000) / 32_000 > spec.prefill_s(2_000) / 2_000


def test_decode_fast_forward_equals_step_by_step_sum() -> None:
    spec = engine_spec()
    engine = EngineModel(spec, emit_token_events=True)
    engine.submit(EngineRequest(1, (1, 2), 2 * BT, 6), 0.0)
    events = run_all(engine)
    first = first_token(events, 1).time_s
    expected = first
    for generated in range(1, 6):
        context = 2 * BT + generated
        expected += (
            spec.step_overhead_s + spec.decode_s_per_seq + context * spec.kv_read_s_per_token
        )
    assert finished(events, 1).time_s == pytest.approx(expected)
    tokens = [e for e in events if e.kind == EngineEventKind.TOKEN]
    assert [e.output_tokens for e in tokens] == [2, 3, 4, 5, 6]
    assert all(a.time_s < b.time_s for a, b in itertools.pairwise(tokens))


def test_submit_during_fast_forward_joins_at_the_next_step() -> None:
    spec = engine_spec()
    engine = EngineModel(spec)
    engine.submit(EngineRequest(1, (1, 2), 2 * BT, 200), 0.0)
    events = engine.advance(0.1)  # inside the decode-only stretch
    assert events
    assert events[0].kind == EngineEventKind.FIRST_TOKEN
    engine.submit(EngineRequest(2, (3, 4), 2 * BT, 2), 0.1)
    at_s = engine.next_event_s()
    assert at_s is not None
    assert at_s < 0.1 + 2 * (spec.step_overhead_s + 3 * spec.decode_s_per_seq)
    events = run_all(engine)
    assert first_token(events, 2).time_s < finished(events, 1).time_s


def test_cancel_releases_blocks_and_silences_the_request() -> None:
    engine = EngineModel(engine_spec())
    engine.submit(req(1, [1, 2, 3], output=100), 0.0)
    engine.submit(req(2, [4, 5], output=3), 0.0)
    engine.advance(0.2)
    engine.cancel(1, 0.2)
    engine.check_invariants()
    events = run_all(engine)
    assert all(e.request_id == 2 for e in events)
    assert engine.stats().kv_usage_frac == 0.0


def _twin_cached_tokens(cache_when_scheduled: bool, prompt_blocks: int) -> int:
    """Cached tokens of the second of two identical prompts submitted while another request
    runs (so both are admitted by the same plan, the first one's prefill may be chunked)."""
    engine = EngineModel(engine_spec(), cache_when_scheduled=cache_when_scheduled)
    engine.submit(req(1, [900, 901]), 0.0)
    blocks = list(range(1, prompt_blocks + 1))
    engine.submit(req(2, blocks), 0.001)
    engine.submit(req(3, blocks), 0.001)
    return first_token(run_all(engine), 3).cached_tokens


def test_cache_when_scheduled_serves_a_twin_admitted_in_the_same_step() -> None:
    # 4 blocks: both twins are admitted by one plan. 20 blocks (320 tokens; budget 256 less
    # request 1's decode token): the first twin's first chunk (255 tokens, 15 full blocks)
    # fills the step; the second twin is admitted with the first one's last chunk.
    assert _twin_cached_tokens(True, 4) == 3 * BT
    assert _twin_cached_tokens(False, 4) == 0
    assert _twin_cached_tokens(True, 20) == 19 * BT
    assert _twin_cached_tokens(False, 20) == 15 * BT


def test_too_large_requests_are_rejected() -> None:
    engine = EngineModel(engine_spec(kv_capacity_tokens=4 * BT))
    engine.submit(req(1, [1, 2, 3, 4, 5]), 0.0)
    events = run_all(engine)
    assert [e.kind for e in events] == [EngineEventKind.REJECTED]


def test_time_never_goes_back() -> None:
    engine = EngineModel(engine_spec())
    engine.advance(5.0)
    with pytest.raises(ValueError, match="time went back"):
        engine.submit(req(1, [1]), 4.0)


@pytest.mark.parametrize("name", preset_names())
def test_presets_are_plausible(name: str) -> None:
    spec = get_preset(name)
    assert spec.capacity_blocks > 0
    assert 0.01 < spec.prefill_s(2000) < 1.0


def test_tiny_cpu_matches_its_measurements() -> None:
    spec = get_preset("tiny-cpu")
    assert spec.prefill_s(2000) == pytest.approx(0.270, rel=0.05)
    assert spec.prefill_s(2000, cached_tokens=1920) == pytest.approx(0.030, rel=0.05)


def test_70b_kv_capacity_follows_from_hbm_minus_weights() -> None:
    spec = get_preset("llama-3.1-70b-p5")
    # 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 320 KiB per token
    per_token = 80 * 8 * 128 * 2 * 2
    assert per_token == 320 * 1024
    usable = 8 * (81_559 * 2**20 * 0.9 - 2.5e9) - 141.2e9
    assert spec.kv_capacity_tokens == pytest.approx(usable / per_token, rel=1e-3)


def test_output_blocks_are_cached_when_the_request_finishes() -> None:
    engine = EngineModel(engine_spec())
    engine.submit(EngineRequest(1, (1, 2), 2 * BT, 40, output_block_hashes=(3, 4)), 0.0)
    run_all(engine)
    assert engine.cached_prefix_blocks((1, 2, 3, 4, 5)) == 4
    engine.check_invariants()
