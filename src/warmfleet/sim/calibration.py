"""Calibration of ``warmfleet doctor``'s replay against what happened live (pure; issue 26,
docs/doctor.md "Calibration").

``replay_capture`` replays a capture exactly as ``warmfleet doctor`` does (``run_doctor``: the
records' timestamps as arrivals, the captured strategy with its parameters) on a given fleet
shape: the instance count, the engine preset, the KV capacity per instance and the block size of
the live engines, with the preset's time coefficients divided by ``speedup`` (an emulator run
``speedup`` times faster than its preset: the replay's times are then wall-clock, like the
capture's). When the capture names each request's instance, the figures are those of the
captured placements replayed (``sim.placements``): the engine model against what happened, not
a second draw of the strategy's choices; the fresh draw's are reported beside them.
``calibration_row`` sets the replay's figures beside the live ones and computes the errors;
``row_failures`` names the targets a row misses.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmfleet.core.errors import ConfigError
from warmfleet.core.types import Reason
from warmfleet.engine.presets import get_preset
from warmfleet.sim.doctor_run import run_doctor
from warmfleet.sim.metrics import percentile
from warmfleet.sim.runner import StrategyRun
from warmfleet.sim.scenario import EngineOverrides
from warmfleet.sim.trace_fleet import trace_scenario
from warmfleet.sim.workloads.traces import Trace, parse_trace_text

# the acceptance targets (issue 26)
MAX_HIT_RATE_ABS_ERROR = 0.03
TTFT_P50_RATIO_RANGE = (0.75, 1.33)
TIME_FIELDS = (
    "step_overhead_s",
    "prefill_s_per_token",
    "prefill_attn_s_per_token_pair",
    "decode_s_per_seq",
    "kv_read_s_per_token",
)


@dataclass(frozen=True, slots=True)
class ReplayFleet:
    """The live fleet's shape, for the replay."""

    instances: int
    preset: str
    kv_capacity_tokens: int
    block_tokens: int | None = None  # None: the capture header's (its key block size)
    speedup: float = 1.0


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    """The captured strategy's replay, as the waterfall's ``captured_replay`` step has it:
    ``replay`` ``placements`` (the capture names instances: each request went where it went
    live, ``placed_requests`` of them) or ``fresh_draw`` (the strategy chose again);
    ``fresh_draw``: the fresh draw's (hit rate, TTFT P50 ms) beside the placements'."""

    strategy: str  # the run replayed (the captured strategy)
    requests: int
    hit_rate: float
    ttft_p50_ms: float
    replay: str = "fresh_draw"
    placed_requests: int = 0
    fresh_draw: tuple[float, float] | None = None


def engine_overrides(fleet: ReplayFleet) -> EngineOverrides:
    """The preset's engine at the live KV capacity, ``speedup`` times faster."""
    if fleet.speedup <= 0:
        raise ConfigError(f"speedup: must be > 0, got {fleet.speedup}")
    spec = get_preset(fleet.preset)
    times = {name: getattr(spec, name) / fleet.speedup for name in TIME_FIELDS}
    return EngineOverrides(
        kv_capacity_tokens=fleet.kv_capacity_tokens, block_tokens=fleet.block_tokens, **times
    )


def replay_capture(text: str, source: str, fleet: ReplayFleet) -> ReplayFigures:
    """Replay the capture ``text`` (its header names the strategy) on ``fleet`` as
    ``warmfleet doctor`` does; the captured strategy's replayed hit rate and TTFT P50."""
    trace = Trace(text, source)
    parsed = parse_trace_text(trace)
    if not parsed.records:
        raise ConfigError(f"{source}: the capture has no records")
    scenario = trace_scenario(trace, parsed.header, instances=fleet.instances, preset=fleet.preset)
    scenario = scenario.model_copy(update={"engine": engine_overrides(fleet)})
    result = run_doctor(scenario, trace, parsed)
    if result.captured is None:
        raise ConfigError(f"{source}: the capture's header names no strategy (fleet.strategy)")
    fresh = result.run(result.captured)
    run = result.placed or fresh
    return ReplayFigures(
        strategy=result.captured,
        requests=len(parsed.records),
        hit_rate=run.metrics.hit_rate,
        ttft_p50_ms=_p50_ms(run),
        replay="fresh_draw" if result.placed is None else "placements",
        placed_requests=run.metrics.decisions_by_reason.get(str(Reason.REPLAYED), 0),
        fresh_draw=(fresh.metrics.hit_rate, _p50_ms(fresh)),
    )


def _p50_ms(run: StrategyRun) -> float:
    return percentile(run.metrics.ttft_s, 50) * 1000.0


@dataclass(frozen=True, slots=True)
class LiveFigures:
    hit_rate: float  # engine-reported (metrics deltas)
    ttft_p50_ms: float  # gateway-measured: the capture's own ``ttft_ms`` (what doctor is given)
    requests_answered: int
    capture_lines: int
    capture_dropped: int
    client_ttft_p50_ms: float | None = None  # the load generator's (client time included)


def capture_ttft_p50_ms(text: str, source: str) -> float:
    """P50 of the ``ttft_ms`` the gateway recorded for the capture's answered (2xx) requests."""
    parsed = parse_trace_text(Trace(text, source))
    ttfts_s = [
        float(r.ttft_ms) / 1000.0
        for r in parsed.records
        if r.ttft_ms is not None and r.status is not None and 200 <= r.status < 300
    ]
    if not ttfts_s:
        raise ConfigError(f"{source}: no answered record carries ttft_ms")
    return percentile(ttfts_s, 50) * 1000.0


def calibration_row(live: LiveFigures, replay: ReplayFigures) -> dict[str, float | int | str]:
    """One strategy's row of ``bench-results/doctor.json``."""
    ratio = replay.ttft_p50_ms / live.ttft_p50_ms if live.ttft_p50_ms > 0 else float("inf")
    fresh_hit, fresh_ttft_ms = replay.fresh_draw or (float("nan"), float("nan"))
    return {
        "replayed_as": replay.strategy,
        "replay": replay.replay,
        "replay_placed_requests": replay.placed_requests,
        "live_hit_rate": live.hit_rate,
        "replay_hit_rate": replay.hit_rate,
        "hit_rate_abs_error": abs(replay.hit_rate - live.hit_rate),
        "replay_hit_rate_fresh_draw": fresh_hit,
        "hit_rate_abs_error_fresh_draw": abs(fresh_hit - live.hit_rate),
        "replay_ttft_p50_ms_fresh_draw": fresh_ttft_ms,
        "live_ttft_p50_ms": live.ttft_p50_ms,
        "live_client_ttft_p50_ms": (
            live.client_ttft_p50_ms if live.client_ttft_p50_ms is not None else float("nan")
        ),
        "replay_ttft_p50_ms": replay.ttft_p50_ms,
        "ttft_p50_ratio": ratio,
        "capture_lines": live.capture_lines,
        "requests_answered": live.requests_answered,
        "capture_dropped": live.capture_dropped,
    }


def row_failures(
    name: str,
    row: dict[str, float | int | str],
    max_hit_rate_error: float = MAX_HIT_RATE_ABS_ERROR,
    ttft_ratio_range: tuple[float, float] | None = TTFT_P50_RATIO_RANGE,
) -> list[str]:
    """The targets ``row`` misses, one sentence each (``ttft_ratio_range`` None: not checked)."""
    out: list[str] = []
    error = float(row["hit_rate_abs_error"])
    if error > max_hit_rate_error:
        out.append(f"{name}: hit_rate_abs_error {error:.4f} > {max_hit_rate_error}")
    if ttft_ratio_range is not None:
        low, high = ttft_ratio_range
        ratio = float(row["ttft_p50_ratio"])
        if not low <= ratio <= high:
            out.append(f"{name}: ttft_p50_ratio {ratio:.3f} outside [{low}, {high}]")
    if row["capture_lines"] != row["requests_answered"]:
        out.append(
            f"{name}: capture_lines {row['capture_lines']} != requests answered "
            f"{row['requests_answered']}"
        )
    if row["capture_dropped"] != 0:
        out.append(f"{name}: capture_dropped {row['capture_dropped']} (want 0)")
    return out
