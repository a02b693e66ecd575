"""Flow-control configuration of a variant (``routing.flow``; docs/flow-control.md).

Pure config only; the objects that act on it live in ``warmfleet.flow``. Absent (``None``) means
no flow control: requests are routed (and spilled) as they arrive, as without this feature.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from warmfleet.core.config import StrictModel


class TenantLimits(StrictModel):
    """One tenant's share and limits. ``weight``: its share of the token-weighted fairness
    (2 = twice the tokens of a weight-1 tenant when both are backlogged);
    ``maxConcurrentRequests`` / ``tokensPerMinute``: caps on its dispatched requests (None =
    no cap); ``defaultPriority``: the priority of its requests that carry none."""

    weight: float = Field(default=1.0, gt=0.0, le=1000.0)
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    default_priority: int | None = Field(default=None, ge=-1000, le=1000)


class BandConfig(StrictModel):
    """A priority band: the requests whose priority is at least ``minPriority`` (and below the
    next band's). ``ttftSloMs``: the band's TTFT objective, used as the deadline of a request
    that carries none (None: no deadline)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    min_priority: int = Field(ge=-1000, le=1000)
    ttft_slo_ms: float | None = Field(default=None, gt=0.0)


def _default_bands() -> tuple[BandConfig, ...]:
    return (
        BandConfig(name="default", min_priority=0),
        BandConfig(name="sheddable", min_priority=-1000),
    )


class FlowControlConfig(StrictModel):
    """Queue instead of spill, with priorities, tenant fairness, deadlines and shedding.

    ``maxInFlightPerInstance``: an instance holding this many dispatched requests is at its cap
    (further requests wait in the gateway's queue or spill by predicted cost).
    ``maxPendingPrefillMs``: an instance is also full while the predicted prefill of the
    requests sent to it and not yet started (first token), the next one's included, would pass
    this (None: no such bound); it keeps engine steps short for the requests that follow.
    ``maxQueuedRequests`` / ``maxQueuedPerFlow``: the queue's bounds (memory is bounded by
    them). ``maxWaitMs``: the longest any request waits, deadline or not (also the hold while
    no replica is ready). ``spill``: ``cost`` decides wait-vs-spill by predicted TTFT,
    ``never`` always waits for the strategy's choice, ``always`` spills at once to the
    strategy's choice among the instances with room (AWS's concurrency-threshold behaviour).
    ``enginePreset``: the engine model (``warmfleet.engine.presets``) the gateway's TTFT
    predictor starts from before its online calibration (the simulator uses its scenario's
    engine instead)."""

    max_in_flight_per_instance: int = Field(default=16, ge=1, le=4096)
    max_pending_prefill_ms: float | None = Field(default=None, gt=0.0)
    max_queued_requests: int = Field(default=1024, ge=1, le=1_000_000)
    max_queued_per_flow: int = Field(default=256, ge=1, le=1_000_000)
    max_wait_ms: float = Field(default=30_000.0, gt=0.0)
    default_priority: int = Field(default=0, ge=-1000, le=1000)
    bands: tuple[BandConfig, ...] = Field(default_factory=_default_bands, min_length=1)
    tenants: dict[str, TenantLimits] = Field(default_factory=dict)
    default_tenant: TenantLimits = Field(default_factory=TenantLimits)
    spill: Literal["cost", "never", "always"] = "cost"
    output_token_weight: float = Field(default=2.0, ge=0.0, le=100.0)
    engine_preset: str = Field(default="llama-3.1-8b-h100", min_length=1, max_length=64)

    @model_validator(mode="after")
    def _bands_distinct(self) -> FlowControlConfig:
        names = [b.name for b in self.bands]
        if len(set(names)) != len(names):
            raise ValueError("bands: names must be distinct")
        floors = [b.min_priority for b in self.bands]
        if len(set(floors)) != len(floors):
            raise ValueError("bands: minPriority values must be distinct")
        if self.default_priority < min(floors):
            raise ValueError("defaultPriority is below every band's minPriority")
        return self
