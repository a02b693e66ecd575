"""A vLLM-like engine instance driven by explicit times (pure, no clock).

The simulator drives it in virtual time, the live emulator in wall-clock time: ``submit`` and
``cancel`` at ``now_s``, ``next_event_s`` says when the engine's state next changes, and
``advance(until_s)`` returns every event that happened up to ``until_s``.

Scheduling follows vLLM's V1 scheduler: every step has a token budget (``max_num_batched_tokens``);
running requests are served first (one token per decoding request, a chunk for a request still in
prefill), then waiting requests are admitted first come first served while fewer than
``max_num_seqs`` run and KV blocks are available (chunked prefill). A request reserves at admission
every block it will need (prompt + output), so there is no preemption; its cached prefix (leading
full blocks already in the cache) is not recomputed, but at least one prompt token always is. Full
prompt blocks are registered in the cache when their prefill chunk is scheduled, as vLLM V1's
``allocate_slots`` does, so a request admitted in the same step (or the next one, while the chunk
still runs) reuses them; ``cache_when_scheduled=False`` registers them only when the chunk completes
(SGLang inserts a chunk into its radix tree after it ran).

Decode-only stretches (nothing in prefill, nothing admissible) are fast-forwarded: the engine plans
one "macro step" of ``k`` decode steps up to the next finish, with the exact closed-form sum of the
per-step times (the KV read grows by one token per sequence per step). A ``submit`` in the middle
shortens the macro step to the next step boundary, so timing equals stepping one token at a time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from warmfleet.engine.blocks import BlockListener, BlockPool
from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest, EngineStats
from warmfleet.engine.spec import EngineSpec


@dataclass(slots=True, eq=False)
class _Seq:
    req: EngineRequest
    computed_tokens: int = 0
    cached_tokens: int = 0
    generated: int = 0
    held: list[int] = field(default_factory=list)  # registered hashes this request references
    next_block: int = 0  # index of the next prompt block to register
    anonymous_blocks: int = 0
    cancelled: bool = False

    @property
    def context_tokens(self) -> int:
        return self.req.prompt_tokens + self.generated


@dataclass(slots=True)
class _Step:
    """A scheduled step (``steps == 1``) or a fast-forwarded run of decode steps."""

    start_s: float
    end_s: float
    prefills: list[tuple[_Seq, int]]
    decodes: list[_Seq]
    steps: int = 1
    first_step_s: float = 0.0  # macro: time of step 0
    growth_s: float = 0.0  # macro: each later step is this much longer

    def elapsed_s(self, steps: int) -> float:
        return steps * self.first_step_s + self.growth_s * steps * (steps - 1) / 2

    def steps_done_by(self, now_s: float) -> int:
        """Whole decode steps of a macro step completed by ``now_s``."""
        delta = now_s - self.start_s
        if delta <= 0:
            return 0
        a, c = self.first_step_s, self.growth_s
        if c > 0:
            b = a - c / 2
            j = int((-b + math.sqrt(b * b + 2 * c * delta)) / c)
        else:
            j = int(delta / a) if a > 0 else self.steps
        j = max(0, min(j, self.steps))
        while j > 0 and self.elapsed_s(j) > delta:
            j -= 1
        while j < self.steps and self.elapsed_s(j + 1) <= delta:
            j += 1
        return j


class EngineModel:
    """One instance: prefix cache, waiting queue, continuous batching, step timing."""

    def __init__(
        self,
        spec: EngineSpec,
        *,
        emit_token_events: bool = False,
        block_listener: BlockListener | None = None,
        token_event_steps: int | None = None,
        cache_when_scheduled: bool = True,
    ) -> None:
        """``token_event_steps``: with ``emit_token_events``, emit only the TOKEN events of the
        last N decode steps of each fast-forwarded run that an ``advance`` passes (None: all).
        A consumer that keeps each request's latest count and the gap between its last two
        tokens sees exactly the same with N = 2, at a fraction of the events.
        ``cache_when_scheduled``: register a prefill chunk's full blocks when the chunk is
        scheduled (vLLM V1, the default), else when it completes (see the module docstring)."""
        if token_event_steps is not None and token_event_steps < 1:
            raise ValueError("token_event_steps must be >= 1")
        self.spec = spec
        self._emit_tokens = emit_token_events
        self._token_event_steps = token_event_steps
        self._cache_when_scheduled = cache_when_scheduled
        self._bt = spec.block_tokens
        self._pool = BlockPool(spec.capacity_blocks, block_listener)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._seqs: dict[int, _Seq] = {}
        self._step: _Step | None = None
        self._pending: list[EngineEvent] = []
        self._now_s = 0.0
        self._queries_tokens = 0
        self._hits_tokens = 0

    # ------------------------------------------------------------------ public API

    def submit(self, req: EngineRequest, now_s: float) -> None:
        self.submit_many((req,), now_s)

    def submit_many(self, reqs: Sequence[EngineRequest], now_s: float) -> None:
        """Requests arriving together (the ``n`` child requests of a vLLM request with
        ``n`` > 1) all wait before a step is planned, as vLLM's engine core takes every queued
        request before it schedules: an idle engine admits them in one step."""
        self._set_now(now_s)
        for req in reqs:
            if req.request_id in self._seqs:
                raise ValueError(f"request {req.request_id} already submitted")
        if len(reqs) > 1 and len({req.request_id for req in reqs}) < len(reqs):
            raise ValueError("request ids submitted together must differ")
        queued = False
        for req in reqs:
            if not self._fits(req):
                self._pending.append(EngineEvent(EngineEventKind.REJECTED, req.request_id, now_s))
                continue
            seq = _Seq(req)
            self._seqs[req.request_id] = seq
            self._waiting.append(seq)
            queued = True
        if queued and self._step is None:
            self._plan(now_s)
        elif queued:
            self._shorten_macro(now_s)

    def cancel(self, request_id: int, now_s: float) -> None:
        """Forget a request (client went away); no further events for it."""
        self._set_now(now_s)
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        seq.cancelled = True
        if seq in self._running:
            self._shorten_macro(now_s)
            self._running.remove(seq)
            self._pool.release(seq.held, seq.anonymous_blocks)
        else:
            self._waiting.remove(seq)

    def next_event_s(self) -> float | None:
        if self._pending:
            return self._pending[0].time_s
        return None if self._step is None else self._step.end_s

    def advance(self, until_s: float) -> list[EngineEvent]:
        """Run every step that ends at or before ``until_s``; return the events, in time order."""
        self._set_now(until_s)
        events = self._pending
        self._pending = []
        while self._step is not None and self._step.end_s <= until_s:
            finished = self._step
            self._step = None
            self._complete(finished, events)
            self._plan(finished.end_s)
        current = self._step
        if current is not None and current.steps > 1:
            done = current.steps_done_by(until_s)
            if done > 0:
                self._split_macro(current, done, events)
        return events

    def stats(self) -> EngineStats:
        pool = self._pool
        capacity = max(pool.capacity_blocks, 1)
        return EngineStats(
            prefix_cache_queries_tokens=self._queries_tokens,
            prefix_cache_hits_tokens=self._hits_tokens,
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage_frac=pool.referenced_blocks / capacity,
            cached_blocks=pool.cached_blocks,
            capacity_blocks=pool.capacity_blocks,
        )

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...] | list[int]) -> int:
        return self._pool.cached_prefix(block_hashes)

    def reset_prefix_cache(self) -> bool:  # sleep mode: False while requests wait or run
        return not self._seqs and self._pool.reset()

    def check_invariants(self) -> None:
        self._pool.check_invariants()
        shared = {h for s in self._running for h in s.held}
        held = len(shared) + sum(s.anonymous_blocks for s in self._running)
        assert held == self._pool.referenced_blocks, (held, self._pool.referenced_blocks)
        assert len(self._running) <= self.spec.max_num_seqs

    # ------------------------------------------------------------------ internals

    def _set_now(self, now_s: float) -> None:
        if now_s < self._now_s:
            raise ValueError(f"time went back: {now_s} < {self._now_s}")
        self._now_s = now_s

    def _blocks_needed(self, req: EngineRequest) -> int:
        return -(-(req.prompt_tokens + max(req.output_tokens, 1)) // self._bt)

    def _fits(self, req: EngineRequest) -> bool:
        total = req.prompt_tokens + max(req.output_tokens, 1)
        return (
            req.prompt_tokens >= 1
            and total <= self.spec.max_model_len
            and self._blocks_needed(req) <= self._pool.capacity_blocks
        )

    def _try_admit(self, seq: _Seq) -> bool:
        req = seq.req
        pool = self._pool
        hit = pool.cached_prefix(req.block_hashes)
        hit = min(hit, (req.prompt_tokens - 1) // self._bt)  # at least one token is computed
        hit_hashes = req.block_hashes[:hit]
        new_blocks = self._blocks_needed(req) - hit
        if new_blocks > pool.available_for(hit_hashes):
            return False
        pool.acquire(hit_hashes, new_blocks)
        seq.held = list(hit_hashes)
        seq.next_block = hit
        seq.anonymous_blocks = new_blocks
        seq.cached_tokens = seq.computed_tokens = hit * self._bt
        self._queries_tokens += req.prompt_tokens
        self._hits_tokens += seq.cached_tokens
        return True

    def _plan(self, now_s: float) -> None:
        """Schedule the next step starting at ``now_s`` (or go idle)."""
        budget = self.spec.max_num_batched_tokens
        prefills: list[tuple[_Seq, int]] = []
        decodes: list[_Seq] = []
        for seq in self._running:
            left = seq.req.prompt_tokens - seq.computed_tokens
            if left <= 0:
                decodes.append(seq)
                budget -= 1
            elif budget > 0:
                chunk = min(left, budget)
                self._schedule_prefill(seq, chunk, prefills)
                budget -= chunk
        waiting = self._waiting
        while waiting and budget > 0 and len(self._running) < self.spec.max_num_seqs:
            seq = waiting[0]
            if not self._try_admit(seq):
                break
            waiting.popleft()
            self._running.append(seq)
            chunk = min(seq.req.prompt_tokens - seq.computed_tokens, budget)
            self._schedule_prefill(seq, chunk, prefills)
            budget -= chunk
        if prefills:
            self._step = self._mixed_step(now_s, prefills, decodes)
        elif decodes:
            self._step = self._decode_macro(now_s, decodes)
        else:
            self._step = None

    def _schedule_prefill(self, seq: _Seq, chunk: int, prefills: list[tuple[_Seq, int]]) -> None:
        prefills.append((seq, chunk))
        if self._cache_when_scheduled:
            self._register_blocks(seq, seq.computed_tokens + chunk)

    def _mixed_step(
        self, now_s: float, prefills: list[tuple[_Seq, int]], decodes: list[_Seq]
    ) -> _Step:
        spec = self.spec
        duration = spec.step_overhead_s
        duration += len(decodes) * spec.decode_s_per_seq
        duration += sum(s.context_tokens for s in decodes) * spec.kv_read_s_per_token
        for seq, chunk in prefills:
            duration += chunk * spec.prefill_s_per_token
            duration += (
                chunk * (seq.computed_tokens + chunk / 2) * spec.prefill_attn_s_per_token_pair
            )
        return _Step(now_s, now_s + duration, prefills, decodes)

    def _decode_macro(self, now_s: float, decodes: list[_Seq]) -> _Step:
        spec = self.spec
        steps = min(max(s.req.output_tokens, 1) - s.generated for s in decodes)
        steps = max(steps, 1)
        batch = len(decodes)
        first = spec.step_overhead_s + batch * spec.decode_s_per_seq
        first += sum(s.context_tokens for s in decodes) * spec.kv_read_s_per_token
        growth = batch * spec.kv_read_s_per_token
        step = _Step(now_s, now_s, [], decodes, steps, first, growth)
        step.end_s = now_s + step.elapsed_s(steps)
        return step

    def _shorten_macro(self, now_s: float) -> None:
        """A new arrival ends a fast-forward at the next step boundary."""
        step = self._step
        if step is None or step.steps == 1:
            return
        keep = min(step.steps_done_by(now_s) + 1, step.steps)
        if keep < step.steps:
            step.steps = keep
            step.end_s = step.start_s + step.elapsed_s(keep)

    def _split_macro(self, step: _Step, done: int, events: list[EngineEvent]) -> None:
        """Apply the first ``done`` (< steps) decode steps of a macro step in place."""
        self._emit_decode_tokens(step, done, events)
        for seq in step.decodes:
            seq.generated += done
        step.start_s += step.elapsed_s(done)
        step.first_step_s += done * step.growth_s
        step.steps -= done

    def _emit_decode_tokens(self, step: _Step, steps: int, events: list[EngineEvent]) -> None:
        if not self._emit_tokens:
            return
        seqs = [s for s in step.decodes if not s.cancelled and s.req.token_events]
        if not seqs:
            return
        keep = self._token_event_steps
        for i in range(1 if keep is None else max(1, steps - keep + 1), steps + 1):
            at_s = step.start_s + step.elapsed_s(i)
            for seq in seqs:
                events.append(
                    EngineEvent(
                        EngineEventKind.TOKEN, seq.req.request_id, at_s, 0, seq.generated + i
                    )
                )

    def _complete(self, step: _Step, events: list[EngineEvent]) -> None:
        end_s = step.end_s
        if step.steps > 1:
            self._emit_decode_tokens(step, step.steps - 1, events)
        finished: list[_Seq] = []
        for seq, chunk in step.prefills:
            if seq.cancelled:
                continue
            seq.computed_tokens += chunk
            if not self._cache_when_scheduled:
                self._register_blocks(seq, seq.computed_tokens)
            if seq.computed_tokens >= seq.req.prompt_tokens:
                seq.generated = 1
                events.append(
                    EngineEvent(
                        EngineEventKind.FIRST_TOKEN, seq.req.request_id, end_s, seq.cached_tokens, 1
                    )
                )
                if seq.generated >= seq.req.output_tokens:
                    finished.append(seq)
        for seq in step.decodes:
            if seq.cancelled:
                continue
            seq.generated += step.steps
            if self._emit_tokens and seq.req.token_events:
                events.append(
                    EngineEvent(EngineEventKind.TOKEN, seq.req.request_id, end_s, 0, seq.generated)
                )
            if seq.generated >= seq.req.output_tokens:
                finished.append(seq)
        for seq in finished:
            self._finish(seq, end_s, events)

    def _register_blocks(self, seq: _Seq, tokens: int) -> None:
        """Register ``seq``'s prompt blocks that ``tokens`` prompt tokens fill."""
        hashes = seq.req.block_hashes
        full = min(tokens // self._bt, len(hashes))
        if full > seq.next_block:
            registered = self._pool.register_many(hashes[seq.next_block : full])
            seq.held.extend(registered)
            seq.anonymous_blocks -= len(registered)
            seq.next_block = full

    def _finish(self, seq: _Seq, end_s: float, events: list[EngineEvent]) -> None:
        self._running.remove(seq)
        del self._seqs[seq.req.request_id]
        if seq.req.output_block_hashes:
            registered = self._pool.register_many(
                seq.req.output_block_hashes[: seq.anonymous_blocks]
            )
            seq.held.extend(registered)
            seq.anonymous_blocks -= len(registered)
        self._pool.release(seq.held, seq.anonymous_blocks)
        events.append(
            EngineEvent(EngineEventKind.FINISHED, seq.req.request_id, end_s, 0, seq.generated)
        )
