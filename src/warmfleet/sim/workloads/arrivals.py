"""Arrival processes: Poisson, gamma (bursty), trace timestamps, closed-loop concurrency."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated, Literal

from pydantic import Field

from warmfleet.core.config import StrictModel
from warmfleet.sim.workloads.base import WorkloadRequest


class PoissonArrival(StrictModel):
    type: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0.0)


class GammaArrival(StrictModel):
    """Gamma-distributed gaps; ``cv`` > 1 is burstier than Poisson (cv = 1)."""

    type: Literal["gamma"] = "gamma"
    rate_rps: float = Field(gt=0.0)
    cv: float = Field(2.0, gt=0.0)


class TraceArrival(StrictModel):
    """Keep the workload's own timestamps, divided by ``speedup``."""

    type: Literal["trace"] = "trace"
    speedup: float = Field(1.0, gt=0.0)


class ClosedLoopArrival(StrictModel):
    """``concurrency`` clients, each sending its next request when the previous one finished."""

    type: Literal["closed"] = "closed"
    concurrency: int = Field(ge=1)


ArrivalConfig = Annotated[
    PoissonArrival | GammaArrival | TraceArrival | ClosedLoopArrival, Field(discriminator="type")
]


def _gaps(config: PoissonArrival | GammaArrival, count: int, rng: random.Random) -> list[float]:
    if isinstance(config, PoissonArrival):
        return [rng.expovariate(config.rate_rps) for _ in range(count)]
    shape = 1.0 / (config.cv * config.cv)
    scale = 1.0 / (config.rate_rps * shape)
    return [rng.gammavariate(shape, scale) for _ in range(count)]


def apply_arrivals(
    requests: Sequence[WorkloadRequest], config: ArrivalConfig, rng: random.Random
) -> tuple[WorkloadRequest, ...]:
    """Requests re-timed by ``config``, in arrival order (closed loop keeps the order, times 0)."""
    if isinstance(config, TraceArrival):
        timed = [replace(r, arrival_s=r.arrival_s / config.speedup) for r in requests]
    elif isinstance(config, ClosedLoopArrival):
        timed = [replace(r, arrival_s=0.0) for r in requests]
    else:
        now_s = 0.0
        timed = []
        for req, gap_s in zip(requests, _gaps(config, len(requests), rng), strict=True):
            now_s += gap_s
            timed.append(replace(req, arrival_s=now_s))
    return tuple(sorted(timed, key=lambda r: r.arrival_s))


def scale_to_rate(
    requests: Sequence[WorkloadRequest], rate_rps: float
) -> tuple[WorkloadRequest, ...]:
    """Trace timestamps compressed or stretched so the mean arrival rate is ``rate_rps``."""
    if len(requests) < 2:
        return tuple(requests)
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    if span_s <= 0:
        return tuple(requests)
    factor = (len(requests) / rate_rps) / span_s
    start_s = requests[0].arrival_s
    return tuple(replace(r, arrival_s=(r.arrival_s - start_s) * factor) for r in requests)
