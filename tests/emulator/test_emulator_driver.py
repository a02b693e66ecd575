"""The wall-clock driver of the engine model: event order, cached prefixes, cancellation."""

from __future__ import annotations

import asyncio

from emulator_support import DRIVER_SPEC
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.emulator.driver import EngineDriver, RequestStream, running_driver
from warmfleet.engine.events import EngineEvent, EngineEventKind


async def _collect(stream: RequestStream) -> tuple[list[EngineEvent], int]:
    events: list[EngineEvent] = []
    batches = 0
    while not events or events[-1].kind not in (
        EngineEventKind.FINISHED,
        EngineEventKind.REJECTED,
    ):
        events.extend(await stream.next_batch())
        batches += 1
    return events, batches


def _check_order(events: list[EngineEvent], output_tokens: int, streaming: bool) -> None:
    """FIRST_TOKEN, then (streams only) TOKEN events with growing counts, then FINISHED."""
    assert events[0].kind is EngineEventKind.FIRST_TOKEN
    assert events[0].output_tokens == 1
    assert events[-1].kind is EngineEventKind.FINISHED
    assert events[-1].output_tokens == output_tokens
    middle = events[1:-1]
    assert all(e.kind is EngineEventKind.TOKEN for e in middle)
    if not streaming:
        assert not middle
    counts = [e.output_tokens for e in events[:-1]]
    assert counts == sorted(set(counts))
    assert counts[-1] <= output_tokens
    times = [e.time_s for e in events]
    assert times == sorted(times)


async def test_streaming_events_in_order_and_prefix_reuse() -> None:
    async with running_driver(DRIVER_SPEC, speedup=10.0) as driver:
        prefix = tuple(range(1, 9))  # 8 blocks
        first = driver.submit(prefix, 34, 30, wants_tokens=True)
        events, batches = await _collect(first)
        _check_order(events, 30, streaming=True)
        assert len(events) > 3  # tokens are delivered as their steps end
        assert events[0].cached_tokens == 0
        assert batches > 1  # tokens are delivered as steps end, not in one burst
        second = driver.submit((*prefix[:5], 99, 100), 30, 3, wants_tokens=False)
        events, _ = await _collect(second)
        assert events[0].cached_tokens == 5 * 4
        assert driver.in_flight == 0
        stats = driver.stats()
        assert stats.prefix_cache_hits_tokens == 20
        assert stats.prefix_cache_queries_tokens == 64


async def test_cancel_frees_the_engine() -> None:
    async with running_driver(DRIVER_SPEC, speedup=10.0) as driver:
        long = driver.submit((1, 2, 3), 12, 2000, wants_tokens=True)
        first = await long.next_batch()
        assert first[0].kind is EngineEventKind.FIRST_TOKEN
        driver.cancel(long)
        driver.cancel(long)  # idempotent
        assert driver.in_flight == 0
        assert driver.stats().running == 0
        short = driver.submit((7,), 5, 2, wants_tokens=False)
        events, _ = await _collect(short)
        assert events[-1].kind is EngineEventKind.FINISHED


async def test_a_prompt_admitted_with_its_twin_reuses_its_blocks() -> None:
    """vLLM V1 caches a chunk's blocks when it schedules the chunk: of two identical prompts
    admitted in the same step, the second is served from the first one's blocks."""
    slow = DRIVER_SPEC.model_copy(update={"step_overhead_s": 0.2})  # 0.2 s wall per step at 1x
    async with running_driver(slow, speedup=1.0) as driver:
        blocker = driver.submit(tuple(range(50, 60)), 40, 1, wants_tokens=False)
        prompt = tuple(range(1, 9))  # 8 blocks of 4 tokens
        twins = [driver.submit(prompt, 32, 1, wants_tokens=False) for _ in range(2)]
        await _collect(blocker)  # the twins wait for the blocker's step, then run together
        first, second = [(await _collect(twin))[0][0] for twin in twins]
    assert first.time_s == second.time_s  # one step
    assert first.cached_tokens == 0
    assert second.cached_tokens == 7 * 4  # all but the block of the recomputed last token


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 40), st.integers(1, 12), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_every_concurrent_request_completes_with_its_tokens(
    requests: list[tuple[int, int, int, bool]],
) -> None:
    async def run() -> None:
        async with running_driver(DRIVER_SPEC, speedup=50.0) as driver:
            streams = []
            for group, prompt, output, streaming in requests:
                blocks = tuple(group * 100 + b for b in range(prompt // 4))
                streams.append(driver.submit(blocks, prompt, output, wants_tokens=streaming))
            results = await asyncio.gather(*(_collect(s) for s in streams))
            for (_, _, output, streaming), (events, _) in zip(requests, results, strict=True):
                _check_order(events, output, streaming)
            assert driver.in_flight == 0
            assert isinstance(driver, EngineDriver)

    asyncio.run(run())
