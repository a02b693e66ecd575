"""`make bench-doctor`: calibrate ``warmfleet doctor``'s replay against a live emulated fleet.

For ``random`` and ``prefix_affinity`` in turn, a fresh emulated fleet (the demo's: ``tiny-cpu``
instances, a speed-up, KV sized so the shared prefixes take ``working_set_ratio`` x one
instance's KV) and a fresh gateway with ``spec.capture`` on are started as child processes; the
demo's shared-prefix workload is driven through the gateway in closed loop; the engines'
/metrics give the live hit rate and the client the live TTFT P50. The gateway is then stopped
(its capture queue written out) and the capture replayed as ``warmfleet doctor`` replays it
(``sim.calibration.replay_capture``) on the same fleet shape. ``bench-results/doctor.json``
holds each strategy's live and replayed figures and their errors (docs/doctor.md
"Calibration").

The gateway keys in ``tokens`` mode with the emulator's tokenization (``bench.emulator_hf``) and
the engines' block size, so a capture's ``hash_ids`` are the engines' blocks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from warmfleet.bench.doctor_speed import doctor_speed
from warmfleet.bench.emulator_hf import write_emulator_tokenizer
from warmfleet.bench.live_demo import DemoConfig, demo_workload, kv_capacity_tokens
from warmfleet.bench.live_fleet import start_fleet, start_gateway
from warmfleet.bench.live_procs import ProcessSet, terminate_on_sigterm
from warmfleet.bench.loadgen import LoadSpec
from warmfleet.bench.loadgen_metrics import MetricsTarget, measure, scrape
from warmfleet.bench.report import write_json
from warmfleet.bench.terminal import run_async
from warmfleet.core.failures import EXPECTED_EXIT, expected_failure
from warmfleet.edge import read_text_file
from warmfleet.engine.presets import get_preset
from warmfleet.sim.calibration import (
    LiveFigures,
    ReplayFleet,
    calibration_row,
    capture_ttft_p50_ms,
    replay_capture,
    row_failures,
)
from warmfleet.sim.workloads.base import WorkloadRequest, render_prompt_text

STRATEGIES = ("random", "prefix_affinity")
CAPTURE_METRIC = "warmfleet_gateway_capture_{}_total"


def bench_config(requests: int = 240, concurrency: int = 8, speedup: float = 2.0) -> DemoConfig:
    """The demo's fleet and workload (``DemoConfig``), with these counts."""
    return replace(DemoConfig(), requests=requests, concurrency=concurrency, speedup=speedup)


def gateway_routing(strategy: str, block_tokens: int) -> dict[str, Any]:
    """``strategy`` on ``tokens`` keys cut at the engines' block size."""
    return {"strategy": {"type": strategy}, "key": {"mode": "tokens", "blockSize": block_tokens}}


def capture_spec(capture: Path, tokenizer_dir: Path) -> dict[str, Any]:
    """The gateway ``spec`` fields: the tokenizer for ``tokens`` keys and the capture."""
    return {"tokenizerPath": str(tokenizer_dir), "capture": {"path": str(capture)}}


def record_lines(text: str) -> int:
    """The records of a capture file (its header and blank lines not counted)."""
    header = '{"warmfleet_trace"'
    return sum(1 for line in text.splitlines() if line.strip() and not line.startswith(header))


async def _live_strategy(  # noqa: PLR0917 (the bench's state, passed along)
    procs: ProcessSet,
    strategy: str,
    requests: Sequence[WorkloadRequest],
    config: DemoConfig,
    emulator: dict[str, Any],
    tokenizer_dir: Path,
) -> tuple[LiveFigures, Path]:
    """One live run; its figures and the capture file (complete: the gateway was stopped)."""
    fleet = await start_fleet(
        procs, name=f"fleet-{strategy}", instances=config.instances, spec=emulator
    )
    try:
        capture = procs.log_dir / f"capture-{strategy}.jsonl"
        routing = gateway_routing(strategy, get_preset(config.preset).block_tokens)
        extra = capture_spec(capture, tokenizer_dir)
        gateway = await start_gateway(
            procs, fleet, routing, name=f"gateway-{strategy}", extra_spec=extra
        )
        spec = LoadSpec(
            urls=(gateway.url,), model=fleet.model, stream=True, concurrency=config.concurrency,
            max_duration_s=config.max_run_s, request_timeout_s=60.0, ignore_eos=True,
        )  # fmt: skip
        _load, summary = await measure(requests, spec, fleet.metrics_targets, instances=fleet.ids)
        metrics = (await scrape([MetricsTarget("gateway", gateway.url + "/metrics")]))["gateway"]
        procs.stop(gateway.child)  # SIGTERM: the gateway writes its capture queue out
        counts: Any = summary["requests"]
        ttft: Any = summary["ttft_ms"]
        text = read_text_file(capture)
        live = LiveFigures(
            hit_rate=float(str(summary["hit_rate"])),
            ttft_p50_ms=capture_ttft_p50_ms(text, str(capture)),
            requests_answered=int(counts["completed"]),
            capture_lines=record_lines(text),
            capture_dropped=int(metrics.get(CAPTURE_METRIC.format("dropped"), -1)),
            client_ttft_p50_ms=float(ttft["p50"]),
        )
        return live, capture
    finally:
        procs.stop_all()


async def run_bench(
    config: DemoConfig, log_dir: Path, strategies: Sequence[str] = STRATEGIES
) -> dict[str, Any]:
    """Every strategy live then replayed; the ``doctor.json`` document."""
    requests = demo_workload(config)
    capacity = kv_capacity_tokens(requests, config)
    emulator = {"preset": config.preset, "kvCapacityTokens": capacity, "speedup": config.speedup,
                "seed": config.seed}  # fmt: skip
    tokenizer_dir = write_emulator_tokenizer(
        log_dir / "emulator-tokenizer", (render_prompt_text(r.segments) for r in requests)
    )
    fleet = ReplayFleet(config.instances, config.preset, capacity, speedup=config.speedup)
    procs = ProcessSet(log_dir)
    rows: dict[str, Any] = {}
    try:
        for strategy in strategies:
            print(f"bench-doctor: {strategy}: live run", file=sys.stderr, flush=True)
            live, capture = await _live_strategy(
                procs, strategy, requests, config, emulator, tokenizer_dir
            )
            print(f"bench-doctor: {strategy}: replaying {capture}", file=sys.stderr, flush=True)
            replay = replay_capture(read_text_file(capture), str(capture), fleet)
            rows[strategy] = calibration_row(live, replay)
    finally:
        procs.stop_all()
    failures = [f for name, row in rows.items() for f in row_failures(name, row)]
    speed = doctor_speed(procs.log_dir / f"capture-{strategies[-1]}.jsonl", log_dir)
    failures.extend(speed.pop("failures"))
    return {
        "config": {**asdict(config), "instance_kv_capacity_tokens": capacity},
        "replay": {"arrivals": "captured timestamps (as warmfleet doctor replays a capture)"},
        "strategies": rows,
        "doctor_speed": speed,
        "failures": failures,
        "logs": str(log_dir),
    }


def render(out: dict[str, Any]) -> str:
    lines = [
        f"{'strategy':16s} {'hit live':>8s} {'replay':>7s} {'|err|':>6s} "
        f"{'TTFT p50 live':>13s} {'replay':>7s} {'ratio':>6s} {'lines/answered':>15s} dropped"
    ]
    for name, r in out["strategies"].items():
        lines.append(
            f"{name:16s} {r['live_hit_rate']:8.3f} {r['replay_hit_rate']:7.3f} "
            f"{r['hit_rate_abs_error']:6.3f} {r['live_ttft_p50_ms']:10.1f} ms "
            f"{r['replay_ttft_p50_ms']:7.1f} {r['ttft_p50_ratio']:6.2f} "
            f"{r['capture_lines']:>7d}/{r['requests_answered']:<7d} {r['capture_dropped']:>7d}"
        )
    speed = out["doctor_speed"]
    mooncake = "absent" if speed["mooncake_s"] is None else f"{speed['mooncake_s']:.1f} s"
    lines.append(f"warmfleet doctor: {speed['capture_records']:,}-record capture "
                 f"{speed['capture_10k_s']:.1f} s, Mooncake trace {mooncake} "
                 f"(limit {speed['limit_s']:.0f} s)")  # fmt: skip
    lines.extend(f"MISSED: {f}" for f in out["failures"])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warmfleet.bench.doctor_bench")
    parser.add_argument("--out", type=Path, default=Path("bench-results/doctor.json"))
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    config = bench_config(args.requests, args.concurrency, args.speedup)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="warmfleet-bench-doctor-"))
    started = time.perf_counter()
    try:
        with terminate_on_sigterm():
            out = run_async(run_bench(config, log_dir))
    except Exception as err:
        line = expected_failure(err)
        if line is None:
            raise
        print(f"bench-doctor: {line} (logs: {log_dir})", file=sys.stderr)
        return EXPECTED_EXIT
    out["wall_s"] = time.perf_counter() - started
    write_json(out, args.out)
    print(render(out))
    print(f"wrote {args.out} in {out['wall_s']:.0f} s; " + ("targets met" if not out["failures"]
          else f"{len(out['failures'])} target(s) missed"))  # fmt: skip
    return 1 if out["failures"] else 0


if __name__ == "__main__":  # pragma: no cover - the Makefile's entry point
    sys.exit(main())
