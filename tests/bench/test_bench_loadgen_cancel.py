"""A cancelled load stops at the next request even when something below swallowed the
cancellation (a library turning it into an error it then catches): one Ctrl-C ends a run."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from warmfleet.bench import loadgen
from warmfleet.bench.loadgen import LoadSpec, PreparedRequest, RequestResult, run_load
from warmfleet.sim.workloads.base import Segment, WorkloadRequest


def _requests(count: int) -> tuple[WorkloadRequest, ...]:
    return tuple(
        WorkloadRequest(request_id=i, arrival_s=0.0, segments=(Segment(i, 8),), output_tokens=2)
        for i in range(count)
    )


@pytest.mark.parametrize("concurrency", [2, None])
async def test_a_swallowed_cancellation_still_stops_the_run(
    monkeypatch: pytest.MonkeyPatch, concurrency: int | None
) -> None:
    sent: list[int] = []

    async def swallowing_send(
        _session: aiohttp.ClientSession,
        _url: str,
        prepared: PreparedRequest,
        _spec: LoadSpec,
        result: RequestResult,
    ) -> None:
        sent.append(prepared.request.request_id)
        try:
            await asyncio.sleep(0.005)
        except asyncio.CancelledError:  # the bug being defended against: swallowed
            result.error = "timeout"

    monkeypatch.setattr(loadgen, "send_one", swallowing_send)
    spec = LoadSpec(urls=("http://127.0.0.1:9",), concurrency=concurrency, max_in_flight=4)
    task = asyncio.create_task(run_load(_requests(2_000), spec))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5.0)
    assert len(sent) < 200, len(sent)  # stopped at once, not after the 2,000
