"""A calibrated stand-in for an engine: one replica as an M/D/c server (``SlotServer``).

For fleet-sizing runs (the scale-out what-if) where the question is capacity and start-up time,
not prefix caches: ``slots`` concurrent requests, each holding its slot for ``service_s``, and a
first token ``ttft_s`` after it got its slot, ``ttft_s`` drawn from ``ttft_samples_s`` (TTFTs the
engine model measured at a given load). A request that finds every slot busy waits in FIFO order;
its wait adds to its time to first token. A request never ends before its first token.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass

from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest, EngineStats


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """One replica as an M/D/c server calibrated on the engine model.

    ``slots`` concurrent requests (vLLM's max_num_seqs, or fewer if the KV cache holds fewer
    requests of this shape), each holding its slot for ``slots / capacity_rps`` seconds, where
    ``capacity_rps`` is the engine model's saturated throughput. A request that gets a slot has its
    first token after a TTFT drawn from ``ttft_samples_s`` (the engine model's TTFTs at 70 % load);
    a request that waits for a slot adds the wait.
    """

    slots: int
    capacity_rps: float
    ttft_samples_s: tuple[float, ...]

    @property
    def service_s(self) -> float:
        return self.slots / self.capacity_rps


class SlotServer:
    """A ``sim.fleet.Server`` with ``model.slots`` slots; TTFT draws come from ``rng``."""

    def __init__(self, model: ReplicaModel, rng: random.Random) -> None:
        if model.slots < 1 or not model.ttft_samples_s:
            raise ValueError("a slot server needs at least one slot and one TTFT sample")
        self._model = model
        self._service_s = model.service_s
        self._rng = rng
        self._busy = 0
        self._queue: deque[int] = deque()
        self._events: list[tuple[float, int, EngineEvent]] = []
        self._order = itertools.count()

    def submit(self, req: EngineRequest, now_s: float) -> None:
        if self._busy < self._model.slots:
            self._begin(req.request_id, now_s)
        else:
            self._queue.append(req.request_id)

    def _begin(self, request_id: int, now_s: float) -> None:
        self._busy += 1
        ttft_s = self._rng.choice(self._model.ttft_samples_s)
        first = EngineEvent(EngineEventKind.FIRST_TOKEN, request_id, now_s + ttft_s)
        end = EngineEvent(
            EngineEventKind.FINISHED, request_id, now_s + max(self._service_s, ttft_s)
        )
        for event in (first, end):
            heapq.heappush(self._events, (event.time_s, next(self._order), event))

    def next_event_s(self) -> float | None:
        return self._events[0][0] if self._events else None

    def advance(self, until_s: float) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        while self._events and self._events[0][0] <= until_s:
            event = heapq.heappop(self._events)[2]
            out.append(event)
            if event.kind == EngineEventKind.FINISHED:
                self._busy -= 1
                if self._queue:
                    self._begin(self._queue.popleft(), event.time_s)
        return out

    def stats(self) -> EngineStats:
        return EngineStats(
            prefix_cache_queries_tokens=0,
            prefix_cache_hits_tokens=0,
            running=self._busy,
            waiting=len(self._queue),
            kv_usage_frac=self._busy / self._model.slots,
            cached_blocks=0,
            capacity_blocks=0,
        )

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...] | list[int]) -> int:  # noqa: ARG002
        return 0  # no prefix cache

    def check_invariants(self) -> None:
        assert 0 <= self._busy <= self._model.slots, self._busy
        assert not self._queue or self._busy == self._model.slots
