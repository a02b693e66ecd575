"""`warmfleet demo` (`make demo`): the four strategies on a live emulated fleet behind the gateway.

For each strategy a fresh emulated fleet (so every strategy starts with cold caches) and a fresh
gateway are started as child processes, the same shared-prefix workload (aws-long-context: groups
of requests sharing a long prefix, each with its own question) is driven through the gateway in
closed loop, and the engines' /metrics are scraped before and after. The KV capacity of each
instance is sized so the shared prefixes take ``working_set_ratio`` times one instance's KV (and
fit the fleet). Every child is stopped by PID on every exit path, Ctrl-C included.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmfleet.bench.live_fleet import start_fleet, start_gateway
from warmfleet.bench.live_procs import ProcessSet, terminate_on_sigterm
from warmfleet.bench.loadgen import LoadResult, LoadSpec
from warmfleet.bench.loadgen_metrics import measure
from warmfleet.bench.loadgen_report import comparison_report, print_runs, write_report
from warmfleet.bench.progress import Activity, activity_for
from warmfleet.bench.sim_cli import DEMO_STRATEGIES
from warmfleet.bench.terminal import progress_bar, run_async
from warmfleet.display import OutputFormat, chatter_console
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.engine.presets import get_preset
from warmfleet.sim.metrics import ideal_hit_tokens
from warmfleet.sim.runner import prepare, routing_keys
from warmfleet.sim.workloads.base import (
    WorkloadRequest,
    render_prompt_text,
    render_segment_text,
)
from warmfleet.sim.workloads.synthetic import AwsLongContextConfig, aws_long_context


@dataclass(frozen=True)
class DemoConfig:
    """Sized for ~60-90 s on 2 cores (4 strategies)."""

    instances: int = 4
    groups: int = 16
    requests: int = 240
    prefix_words: int = 1200
    question_words: int = 60
    output_tokens: int = 16
    concurrency: int = 8
    working_set_ratio: float = 3.0  # shared prefixes / one instance's KV
    preset: str = "tiny-cpu"
    speedup: float = 2.0
    seed: int = 0
    max_run_s: float = 60.0


def demo_workload(config: DemoConfig) -> tuple[WorkloadRequest, ...]:
    workload = AwsLongContextConfig(
        groups=config.groups,
        requests=config.requests,
        prefix_tokens=config.prefix_words,
        question_tokens=config.question_words,
        output_tokens=config.output_tokens,
    )
    return aws_long_context(workload, 0, config.seed)


def shared_prefix_tokens(requests: Sequence[WorkloadRequest]) -> int:
    """Emulator tokens of the distinct first segments (the shared prefixes)."""
    tokenizer = EmulatorTokenizer()
    prefixes = {r.segments[0] for r in requests}
    return sum(len(tokenizer.encode(render_segment_text(s))) for s in prefixes)


def kv_capacity_tokens(requests: Sequence[WorkloadRequest], config: DemoConfig) -> int:
    """Shared prefixes / ``working_set_ratio``, but room for at least two whole prompts."""
    block = get_preset(config.preset).block_tokens
    tokens = int(shared_prefix_tokens(requests) / config.working_set_ratio)
    tokenizer = EmulatorTokenizer()
    longest = max(len(tokenizer.encode(render_prompt_text(r.segments))) for r in requests[:32])
    tokens = max(tokens, 2 * (longest + block))
    return max(block, -(-tokens // block) * block)


def ideal_hit_rate(requests: Sequence[WorkloadRequest]) -> float:
    """Hit rate of one infinite cache fed the stream (workload tokens, 16-token blocks)."""
    prepared = prepare(requests, 16)
    keys = routing_keys(prepared, 4096)
    order = list(range(len(requests)))
    total = sum(r.prompt_tokens for r in requests) or 1
    return ideal_hit_tokens(keys, order, 16) / total


async def _one_strategy(  # noqa: PLR0917 (the demo's state, passed along)
    procs: ProcessSet,
    strategy: str,
    requests: Sequence[WorkloadRequest],
    config: DemoConfig,
    emulator: dict[str, Any],
    activity: Activity,
) -> tuple[LoadResult, dict[str, object]]:
    activity.log(f"{strategy}: starting {config.instances} emulated instances and a gateway")
    fleet = await start_fleet(
        procs, name=f"fleet-{strategy}", instances=config.instances, spec=emulator
    )
    try:
        routing = {"strategy": {"type": strategy}, "key": {"mode": "text"}}
        gateway = await start_gateway(procs, fleet, routing, name=f"gateway-{strategy}")
        spec = LoadSpec(
            urls=(gateway.url,),
            model=fleet.model,
            stream=True,
            concurrency=config.concurrency,
            max_duration_s=config.max_run_s,
            request_timeout_s=60.0,
            ignore_eos=True,
        )
        bounds = {"ideal": ideal_hit_rate(requests)}
        with progress_bar(len(requests), strategy, activity) as on_done:
            return await measure(
                requests, spec, fleet.metrics_targets, instances=fleet.ids,
                reuse_bounds=bounds, on_done=on_done,
            )  # fmt: skip
    finally:
        procs.stop_all()


async def run_live_demo(
    report_dir: Path,
    config: DemoConfig | None = None,
    strategies: Sequence[str] = DEMO_STRATEGIES,
    log_dir: Path | None = None,
    fmt: OutputFormat = OutputFormat.table,
) -> dict[str, Any]:
    """Run every strategy, write ``report_dir``/report.{json,md} and PNGs; the report. Progress
    is shown as for a command printing ``fmt``."""
    config = config or DemoConfig()
    requests = demo_workload(config)
    capacity = kv_capacity_tokens(requests, config)
    emulator = {"preset": config.preset, "kvCapacityTokens": capacity, "speedup": config.speedup,
                "seed": config.seed}  # fmt: skip
    logs = log_dir or Path(tempfile.mkdtemp(prefix="warmfleet-demo-"))
    procs = ProcessSet(logs)
    runs: dict[str, dict[str, object]] = {}
    loads: dict[str, LoadResult] = {}
    try:
        with activity_for(fmt) as activity:
            for strategy in strategies:
                loads[strategy], runs[strategy] = await _one_strategy(
                    procs, strategy, requests, config, emulator, activity
                )
            activity.log(f"writing the report to {report_dir}")
    finally:
        procs.stop_all()
    report = comparison_report(_report_meta(config, requests, capacity, logs), runs)
    write_report(report, loads, report_dir, "warmfleet live demo: strategies on an emulated fleet")
    return report


def _report_meta(
    config: DemoConfig, requests: Sequence[WorkloadRequest], capacity: int, logs: Path
) -> dict[str, Any]:
    """The report's ``meta``, shaped as ``warmfleet sim --json``'s."""
    working = shared_prefix_tokens(requests) / capacity
    return {
        "scenario": "aws-long-context-live",
        "workload": "generated",
        "mode": "live",
        "preset": config.preset,
        "seed": config.seed,
        "instances": config.instances,
        "requests": len(requests),
        "block_tokens": get_preset(config.preset).block_tokens,
        "instance_kv_capacity_tokens": capacity,
        "working_set_ratio": working,
        "fleet_working_set_ratio": working / config.instances,
        "closed_loop_concurrency": config.concurrency,
        "stream": True,
        "router_overhead_ms": None,
        "kv_events_delay_ms": None,  # the emulators publish none: approximate routing
        "strategy_configs": {},  # every strategy with its defaults, as in the simulator's
        "speedup": config.speedup,
        "logs": str(logs),
    }


def main_live_demo(
    report: Path,
    *,
    requests: int = 240,
    concurrency: int = 8,
    speedup: float = 2.0,
    fmt: OutputFormat = OutputFormat.table,
    wide: bool = False,
) -> dict[str, Any]:
    """Run the demo, print the comparison table; the report (``warmfleet demo``)."""
    config = DemoConfig(requests=requests, concurrency=concurrency, speedup=speedup)
    started = time.perf_counter()
    with terminate_on_sigterm():
        result = run_async(run_live_demo(report, config, fmt=fmt))
    title = (
        f"live: {result['scenario']} | {result['instances']} emulated instances | "
        f"{result['requests']} requests/strategy | c={result['closed_loop_concurrency']} | "
        f"shared prefixes = {result['working_set_ratio']:.1f} x one instance's KV"
    )
    print_runs(result, title, fmt, wide)
    out = chatter_console(fmt)
    out.print(f"wrote {report}/report.json, report.md, ttft_cdf.png, share.png, hit_rate.png")
    out.print(f"demo finished in {time.perf_counter() - started:.1f} s")
    return result
