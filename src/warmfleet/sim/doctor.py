"""``warmfleet doctor``'s figures that need no replay (pure): the reuse bounds of a trace, the
waterfall's largest loss and what closes it, what the trace's instance churn says, and the
engine-reported reuse. The replays themselves are ``sim.doctor_run``'s; docs/doctor.md.

The waterfall of KV reuse (each step a share of prompt tokens served from cache):
``ideal`` (one infinite cache) >= ``fleet_ceiling`` (one LRU of the whole fleet's KV) ->
``best_replay`` (the best strategy in replay) >= ``captured_replay`` (the captured strategy in
replay) -> ``delivered`` (what the engines reported live).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warmfleet.api.trace_format import TraceRecord
from warmfleet.routing.key_spec import DEFAULT_PREFIX_LENGTH
from warmfleet.sim.metrics import ideal_hit_tokens, lru_hit_tokens
from warmfleet.sim.records import continuation_blocks, plan_sessions
from warmfleet.sim.runner import Prepared, routing_keys

STEPS = ("ideal", "fleet_ceiling", "best_replay", "captured_replay", "delivered")
# what closes the loss INTO each step (from the step before it)
CLOSERS = {
    "fleet_ceiling": "more KV: more instances or more KV per instance (the reuse the traffic "
    "offers does not fit in the fleet's KV)",
    "best_replay": "a more cache-aware routing strategy (the fleet's KV works less like one "
    "shared cache than it could)",
    "captured_replay": "switch to the best strategy in replay, or tune the captured one's "
    "parameters",
    "delivered": "an engine or configuration mismatch between the live fleet and its replay "
    "(block size, KV capacity, prefix caching off, a different engine)",
}
PRESENT_AT_START_S = 60.0  # an instance first seen within this of the trace's start was there
WARM_WINDOW_S = 60.0  # a joined instance's first this-many seconds: a scale-out window


@dataclass(frozen=True, slots=True)
class Loss:
    """The largest drop between consecutive measured steps and what closes it."""

    from_step: str
    to_step: str
    loss: float
    closes: str

    def as_report(self) -> dict[str, object]:
        return {
            "from": self.from_step,
            "to": self.to_step,
            "loss": self.loss,
            "closes": self.closes,
        }


def largest_loss(waterfall: Mapping[str, float | None]) -> Loss | None:
    """The biggest drop between consecutive steps (a step not measured is skipped: the drop is
    then counted into the next measured one); None when no step loses anything."""
    measured = [(step, waterfall[step]) for step in STEPS if waterfall.get(step) is not None]
    best: Loss | None = None
    for (before, high), (after, low) in itertools.pairwise(measured):
        drop = float(high or 0.0) - float(low or 0.0)
        if drop > 0 and (best is None or drop > best.loss):
            best = Loss(before, after, drop, CLOSERS[after])
    return best


def reuse_bounds(prepared: Prepared, capacity_blocks: int) -> tuple[float, float]:
    """(ideal, fleet ceiling): token-weighted hit rates of one infinite cache and of one LRU of
    ``capacity_blocks`` (the whole fleet's KV) fed every request in arrival order, a session's
    answers entering the cache as the engines' do. ideal >= fleet ceiling by construction."""
    keys = routing_keys(prepared, DEFAULT_PREFIX_LENGTH)
    next_turn, _ = plan_sessions(prepared.requests)
    output_blocks = continuation_blocks(keys, prepared.requests, next_turn, prepared.block_tokens)
    order = sorted(range(len(keys)), key=lambda i: (prepared.requests[i].arrival_s, i))
    prompt_tokens = sum(r.prompt_tokens for r in prepared.requests) or 1
    ideal = ideal_hit_tokens(keys, order, prepared.block_tokens, output_blocks)
    ceiling = lru_hit_tokens(keys, order, prepared.block_tokens, capacity_blocks, output_blocks)
    return ideal / prompt_tokens, ceiling / prompt_tokens


def delivered(records: Sequence[TraceRecord]) -> float | None:
    """Engine-reported reuse: sum ``engine_cached_tokens`` / sum ``input_length`` over the
    records carrying it; None when none does (a trace without engine figures)."""
    reported = [r for r in records if r.engine_cached_tokens is not None]
    prompt_tokens = sum(r.input_length for r in reported)
    if not reported or prompt_tokens == 0:
        return None
    return sum(r.engine_cached_tokens or 0 for r in reported) / prompt_tokens


@dataclass(frozen=True, slots=True)
class Churn:
    """The instances a capture saw join: ``joins`` (instance -> first request, s from the
    trace's start) for those first seen after ``PRESENT_AT_START_S``; ``reason`` says why no
    churn figure can be derived (None: they can)."""

    joins: dict[str, float]
    instances_seen: int
    reason: str | None

    def windows(self) -> list[tuple[float, float]]:
        """The scale-out windows: each joined instance's first ``WARM_WINDOW_S``."""
        return sorted((at_s, at_s + WARM_WINDOW_S) for at_s in self.joins.values())


def churn_of(records: Sequence[TraceRecord]) -> Churn:
    """Instance churn from the records' ``instance`` values (a capture's)."""
    first_s: dict[str, float] = {}
    start_s = min((r.timestamp for r in records), default=0.0) / 1000.0
    for record in sorted(records, key=lambda r: r.timestamp):
        if record.instance is not None:
            first_s.setdefault(record.instance, record.timestamp / 1000.0 - start_s)
    if not first_s:
        return Churn({}, 0, "the trace has no instance field (not a capture)")
    joins = {i: at_s for i, at_s in first_s.items() if at_s > PRESENT_AT_START_S}
    reason = None if joins else "no instance joined during the trace"
    return Churn(joins, len(first_s), reason)


def session_count(records: Sequence[TraceRecord]) -> int:
    """The trace's sessions: one per (tenant, session) pair, as its replay keys them
    (``workloads.traces.trace_file_requests``)."""
    return len({(r.tenant, r.session) for r in records if r.session is not None})


def in_windows(at_s: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= at_s < end for start, end in windows)


def unprepared_share(records: Sequence[TraceRecord], churn: Churn) -> float | None:
    """The share of requests that reached an instance in its first ``WARM_WINDOW_S`` after it
    joined (its node had served nothing of this traffic: cold KV, possibly cold weights and
    image); None when the trace has no ``instance`` field."""
    if churn.instances_seen == 0 or not records:
        return None
    start_s = min(r.timestamp for r in records) / 1000.0
    cold = 0
    for record in records:
        joined_s = churn.joins.get(record.instance or "")
        at_s = record.timestamp / 1000.0 - start_s
        if joined_s is not None and joined_s <= at_s < joined_s + WARM_WINDOW_S:
            cold += 1
    return cold / len(records)


def live_hit_rate_in(
    records: Sequence[TraceRecord], windows: Sequence[tuple[float, float]]
) -> float | None:
    """Engine-reported reuse of the requests arriving in ``windows`` (None: no figures)."""
    if not records:
        return None
    start_s = min(r.timestamp for r in records) / 1000.0
    inside = [r for r in records if in_windows(r.timestamp / 1000.0 - start_s, windows)]
    return delivered(inside)
