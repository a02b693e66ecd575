"""``EngineModel.submit_many``: requests arriving together (vLLM's ``n`` > 1 child requests)."""

from __future__ import annotations

import pytest

from support.engines import BLOCK_TOKENS, engine_spec
from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest
from warmfleet.engine.model import EngineModel

BT = BLOCK_TOKENS
SPEC = engine_spec(prefill_attn_s_per_token_pair=0.0)
PROMPT = (11, 12, 13, 14)  # 4 full blocks of a 65-token prompt


def _children(first_id: int, outputs: list[int]) -> list[EngineRequest]:
    return [EngineRequest(first_id + i, PROMPT, 4 * BT + 1, out) for i, out in enumerate(outputs)]


def _run(engine: EngineModel) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    while (at := engine.next_event_s()) is not None:
        events += engine.advance(at)
    return events


def _firsts(events: list[EngineEvent]) -> dict[int, EngineEvent]:
    return {e.request_id: e for e in events if e.kind is EngineEventKind.FIRST_TOKEN}


def test_an_idle_engine_admits_the_children_in_one_step() -> None:
    engine = EngineModel(SPEC)
    engine.submit_many(_children(1, [3, 5, 2]), 0.0)
    events = _run(engine)
    firsts = _firsts(events)
    assert [firsts[rid].cached_tokens for rid in (1, 2, 3)] == [0, 4 * BT, 4 * BT]
    assert len({e.time_s for e in firsts.values()}) == 1  # one prefill step for the three
    ends = {e.request_id: e.output_tokens for e in events if e.kind is EngineEventKind.FINISHED}
    assert ends == {1: 3, 2: 5, 3: 2}
    stats = engine.stats()
    assert stats.prefix_cache_queries_tokens == 3 * (4 * BT + 1)
    assert stats.prefix_cache_hits_tokens == 2 * 4 * BT
    engine.check_invariants()


def test_one_by_one_the_first_request_starts_alone() -> None:
    """``submit`` plans a step at once on an idle engine (unchanged for the simulator)."""
    engine = EngineModel(SPEC)
    for child in _children(1, [3, 5, 2]):
        engine.submit(child, 0.0)
    firsts = _firsts(_run(engine))
    assert firsts[1].time_s < firsts[2].time_s == firsts[3].time_s
    assert [firsts[rid].cached_tokens for rid in (1, 2, 3)] == [0, 4 * BT, 4 * BT]


def test_submit_many_rejects_per_request_and_checks_ids() -> None:
    engine = EngineModel(SPEC)
    too_long = EngineRequest(9, (), 5000, 1)  # over max_model_len
    engine.submit_many([too_long, *_children(1, [2])], 0.0)
    events = _run(engine)
    assert (events[0].kind, events[0].request_id) == (EngineEventKind.REJECTED, 9)
    assert [e.kind for e in events if e.request_id == 1][-1] is EngineEventKind.FINISHED
    engine.submit_many([too_long], 1.0)  # nothing queued: the engine stays idle
    assert [e.kind for e in engine.advance(1.0)] == [EngineEventKind.REJECTED]
    assert engine.next_event_s() is None
    with pytest.raises(ValueError, match="must differ"):
        engine.submit_many(_children(20, [50, 50]) + _children(20, [1]), 2.0)
    assert engine.stats().waiting == engine.stats().running == 0  # refused: nothing queued
    engine.submit_many(_children(40, [50]), 2.0)
    with pytest.raises(ValueError, match="already submitted"):
        engine.submit_many([*_children(30, [1]), *_children(40, [1])], 2.0)
    assert engine.stats().waiting + engine.stats().running == 1
