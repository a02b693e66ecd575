"""Hypothesis properties of the engine model: conservation, ordering, fast-forward exactness."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from support.engines import BLOCK_TOKENS, engine_spec
from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest
from warmfleet.engine.model import EngineModel

BT = BLOCK_TOKENS
SPEC = engine_spec(
    name="prop",
    kv_capacity_tokens=48 * BT,
    max_num_seqs=4,
    max_num_batched_tokens=64,
    max_model_len=2048,
    prefill_s_per_token=0.0005,
)

request_st = st.tuples(
    st.floats(0.0, 2.0),  # gap before submit
    st.lists(st.integers(0, 5), min_size=0, max_size=6),  # block content (shared alphabet)
    st.integers(1, 15),  # extra tokens in a partial last block
    st.integers(1, 30),  # output tokens
    st.booleans(),  # cancel it later
)


def _requests(
    raw: list[tuple[float, list[int], int, int, bool]],
) -> list[tuple[float, EngineRequest, bool]]:
    out = []
    now_s = 0.0
    for rid, (gap, content, extra, output, cancel) in enumerate(raw):
        now_s += gap
        chain: list[int] = []
        prev = 7
        for c in content:
            prev = hash((prev, c))
            chain.append(prev)
        out.append(
            (now_s, EngineRequest(rid, tuple(chain), len(chain) * BT + extra, output), cancel)
        )
    return out


def _drive(
    plan: list[tuple[float, EngineRequest, bool]],
    step_s: float | None,
    cache_when_scheduled: bool = False,
) -> tuple[list[EngineEvent], set[int]]:
    """Submit at the planned times; advance to each next event, or in fixed ``step_s`` ticks."""
    engine = EngineModel(SPEC, emit_token_events=True, cache_when_scheduled=cache_when_scheduled)
    events: list[EngineEvent] = []
    cancelled: set[int] = set()
    pending = list(plan)
    now_s = 0.0
    while pending or engine.next_event_s() is not None:
        at_s = engine.next_event_s()
        target = pending[0][0] if pending else None
        if step_s is not None:
            now_s += step_s
            candidates = [t for t in (at_s, target) if t is not None]
            now_s = min([now_s, *candidates]) if candidates else now_s
        elif at_s is not None and (target is None or at_s <= target):
            now_s = at_s
        else:
            assert target is not None
            now_s = target
        events.extend(engine.advance(now_s))
        while pending and pending[0][0] <= now_s:
            _, request, cancel = pending.pop(0)
            engine.submit(request, now_s)
            if cancel and request.request_id % 3 == 0:
                engine.cancel(request.request_id, now_s)
                cancelled.add(request.request_id)
        engine.check_invariants()
    return events, cancelled


@settings(max_examples=60, deadline=None)
@given(st.lists(request_st, min_size=1, max_size=12), st.booleans())
def test_every_request_is_conserved_and_time_is_monotonic(
    raw: list[tuple[float, list[int], int, int, bool]], cache_when_scheduled: bool
) -> None:
    plan = _requests(raw)
    events, cancelled = _drive(plan, None, cache_when_scheduled)
    times = [e.time_s for e in events]
    assert times == sorted(times)
    submitted = {r.request_id: (t, r) for t, r, _ in plan}
    ends = [e for e in events if e.kind in (EngineEventKind.FINISHED, EngineEventKind.REJECTED)]
    ended = [e.request_id for e in ends]
    assert len(ended) == len(set(ended))
    assert set(ended) | cancelled == set(submitted)
    for event in events:
        at_s, request = submitted[event.request_id]
        assert event.time_s >= at_s
        if event.kind == EngineEventKind.FINISHED:
            assert event.output_tokens == request.output_tokens
            firsts = [
                e
                for e in events
                if e.request_id == event.request_id and e.kind == EngineEventKind.FIRST_TOKEN
            ]
            assert len(firsts) == 1
            assert firsts[0].time_s <= event.time_s
            assert firsts[0].cached_tokens < request.prompt_tokens


@settings(max_examples=40, deadline=None)
@given(
    st.lists(request_st, min_size=1, max_size=8),
    st.sampled_from([0.003, 0.05, 0.4]),
    st.booleans(),
)
def test_advancing_in_small_ticks_gives_the_same_events(
    raw: list[tuple[float, list[int], int, int, bool]], step_s: float, cache_when_scheduled: bool
) -> None:
    plan = [(round(t, 3), r, False) for t, r, _ in _requests(raw)]
    coarse, _ = _drive(plan, None, cache_when_scheduled)
    fine, _ = _drive(plan, step_s, cache_when_scheduled)

    def ends(events: list[EngineEvent]) -> dict[int, float]:
        return {e.request_id: e.time_s for e in events if e.kind != EngineEventKind.TOKEN}

    coarse_ends, fine_ends = ends(coarse), ends(fine)
    assert coarse_ends.keys() == fine_ends.keys()
    for rid, at_s in coarse_ends.items():
        assert abs(fine_ends[rid] - at_s) < 1e-6
