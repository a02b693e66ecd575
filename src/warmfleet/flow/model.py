"""Flow-control value types and the TTFT predictor (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from warmfleet.core.errors import BadRequestError
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.engine.spec import EngineSpec

NO_TENANT = ""  # the flow of requests that carry no tenant key
# Retry-After of a shed request: the expected wait, kept within these bounds (seconds)
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60
PRIORITY_RANGE = (-1000, 1000)  # a request's priority; negative = sheddable
MAX_DEADLINE_MS = 3_600_000.0  # an hour: a longer deadline is none at all in practice
# What a header's value may be (ASCII digits only: Python's int() and float() also take "+5",
# "1_0" and "1e3", which no HTTP client sends for these fields)
_PRIORITY_TEXT = re.compile(r"-?[0-9]{1,4}")
_DEADLINE_TEXT = re.compile(r"[0-9]{1,7}(?:\.[0-9]{1,6})?")


def parse_priority(value: str | int, param: str = "x-warmfleet-priority") -> int:
    """A request's priority from a header or body field: an integer within ``PRIORITY_RANGE``;
    anything else is a ``BadRequestError`` naming ``param`` (a 400 at the edge)."""
    if isinstance(value, bool):
        raise BadRequestError(f"{param} must be an integer", param=param)
    if isinstance(value, int):
        priority = value
    elif _PRIORITY_TEXT.fullmatch(text := value.strip()):
        priority = int(text)
    else:
        raise BadRequestError(f"{param} must be an integer", param=param)
    low, high = PRIORITY_RANGE
    if not low <= priority <= high:
        raise BadRequestError(f"{param} must be within {low}..{high}", param=param)
    return priority


def parse_deadline_ms(value: str, param: str = "x-warmfleet-deadline-ms") -> float:
    """A deadline in milliseconds after arrival (``x-warmfleet-deadline-ms``): a positive,
    finite number up to an hour; anything else is a ``BadRequestError`` naming ``param``."""
    if not _DEADLINE_TEXT.fullmatch(text := value.strip()):
        raise BadRequestError(f"{param} must be a number of milliseconds", param=param)
    deadline_ms = float(text)
    if not 0.0 < deadline_ms <= MAX_DEADLINE_MS:  # also rejects nan and inf
        raise BadRequestError(f"{param} must be within (0, {MAX_DEADLINE_MS:.0f}] ms", param=param)
    return deadline_ms


@dataclass(frozen=True, slots=True)
class FlowRequest:
    """One request as flow control sees it. ``request_id`` is the caller's handle (unique
    among the requests in flight); ``priority`` comes validated (``parse_priority``);
    ``deadline_s``: the absolute time by which its first token is due (None: none)."""

    request_id: int
    key: RoutingKey
    tenant: str
    priority: int
    arrival_s: float
    deadline_s: float | None = None
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send ``request`` to ``decision.instance_id`` now. ``decision.reason`` is the strategy's
    own reason when the request did not wait, else ``QUEUED`` or ``SPILL_AFTER_WAIT``.
    ``predicted_ttft_s``: the engine-side TTFT predicted for it (from dispatch)."""

    request: FlowRequest
    decision: Decision
    waited_s: float
    predicted_ttft_s: float


@dataclass(frozen=True, slots=True)
class Shed:
    """Answer ``request`` without serving it: ``status`` 429 (overload, tenant limit, a
    deadline it cannot meet) or 503 (no replica became ready in time), with ``retry_after_s``."""

    request: FlowRequest
    reason: Reason
    status: int
    retry_after_s: int
    waited_s: float


Outcome = Dispatch | Shed


def retry_after_s(expected_wait_s: float) -> int:
    """Whole seconds for ``Retry-After``: the expected wait, at least 1, at most 60."""
    return int(max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, -(-expected_wait_s // 1))))


class TtftPredictor:
    """Engine-side TTFT of a request on one instance, from the engine model's step costs
    (``EngineSpec``): the prefill of its uncached part, the prefill already queued on that
    instance, and the decode batch sharing every step; times one correction factor calibrated
    online from observed TTFTs (an exponentially weighted mean of observed / predicted)."""

    def __init__(self, spec: EngineSpec, *, smoothing: float = 0.05) -> None:
        self.spec = spec
        self.smoothing = smoothing
        self.factor = 1.0
        self.observations = 0

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        """The request's own prefill on an idle engine (at least one token is computed)."""
        cached = max(0, min(cached_tokens, prompt_tokens - 1))
        return self.spec.prefill_s(prompt_tokens, cached)

    def predict_s(self, own_prefill_s: float, queued_prefill_s: float, decoding: int) -> float:
        """Predicted TTFT: queued and own prefill, each prefill step also decoding ``decoding``
        sequences, times the calibration factor."""
        spec = self.spec
        prefill_s = queued_prefill_s + own_prefill_s
        chunk_step_s = spec.step_overhead_s + spec.max_num_batched_tokens * spec.prefill_s_per_token
        steps = max(1.0, prefill_s / max(chunk_step_s, 1e-9))  # steps of full prefill chunks
        decode_s = steps * decoding * spec.decode_s_per_seq
        return self.factor * (prefill_s + decode_s)

    def observe(self, predicted_s: float, observed_s: float) -> None:
        """Calibrate from one request's observed engine-side TTFT."""
        if predicted_s <= 0 or observed_s <= 0:
            return
        ratio = max(0.1, min(10.0, observed_s / (predicted_s / self.factor)))
        self.factor += self.smoothing * (ratio - self.factor)
        self.observations += 1


def key_tokens(key: RoutingKey, cached_blocks: int) -> tuple[int, int]:
    """(prompt tokens, predicted cached tokens) of a key with ``cached_blocks`` cached."""
    prompt = key.prompt_tokens
    if key.units <= 0 or not key.block_hashes:
        return prompt, 0
    cached_units = min(cached_blocks * key.block_size, key.units)
    return prompt, int(prompt * cached_units / key.units)
