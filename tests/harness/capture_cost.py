"""``make bench-capture``: the CPU the traffic capture (``spec.capture``) costs per request, in
one process, capture on beside capture off over the same calls (issue 26).

Each answered request of ``make bench-peers``' c32_8k point, as the proxy hands it to the
capture: an 8,000-character prompt keyed in ``text`` mode (62 salted block hashes, the first 46
one of 8 groups' shared prefix), a ``prefix_hit`` decision, a non-streamed answer whose body ends
with its ``usage``. Three figures, each the median over ``--rounds`` rounds of ``--requests``
calls (every round's figure is kept too: the machine's load moves them), off and on interleaved,
in CPU time of the whole process (``time.process_time``: every thread):

* ``request_path_us``: ``Capture.offer`` per call (what the request waits for), minus the same
  loop without it;
* ``writer_us``: the writer's work per line (``CaptureFile.write`` in batches of ``--batch``
  lines, as the writer gathers them, to a file under ``--dir``);
* ``total_us``: an event loop (uvloop, as the gateway's) offering the requests at ``--rate`` per
  second with the capture's writer task running (its thread hand-offs, formatting and writes),
  minus the same loop with capture off: what ``make bench-peers`` counts in its
  ``router_cpu_ms_per_request`` row for ``prefix_affinity+capture``.

``PYTHONPATH=tests .venv/bin/python -m harness.capture_cost --out bench-results/capture-cost.json``.
A benchmark harness (its requests are test doubles of the proxy's objects), not installed; run it
alone on the machine (under the benchmark lock) and compare figures of one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import uvloop
from prometheus_client import CollectorRegistry

from harness.results import merge_into
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.gateway.capture import Capture, CaptureMetrics
from warmfleet.gateway.capture_config import CaptureConfig
from warmfleet.gateway.capture_file import Captured
from warmfleet.gateway.relay import Attempt, Relay

PROMPT_CHARS = 8000  # make bench-peers' prompts
GROUPS = 8  # prefix groups
TICK_S = 0.01  # the serving loop's requests come in bursts this far apart
BLOCK_CHARS = 128  # text mode's default block size
HEADER = '{"warmfleet_trace":1,"block_tokens":128,"fleet":{"instances":4}}'
USAGE = (
    b'"usage":{"prompt_tokens":2000,"total_tokens":2064,"completion_tokens":64,'
    b'"prompt_tokens_details":{"cached_tokens":1920}}}'
)


def _requests(count: int, seed: int = 0) -> list[tuple[Attempt, Relay]]:
    """``count`` answered requests as the proxy hands them over (``Attempt`` and ``Relay``
    doubles carrying what ``Capture.offer`` reads)."""
    rng = random.Random(seed)
    blocks = PROMPT_CHARS // BLOCK_CHARS
    shared = blocks * 3 // 4  # 8 groups' shared prefixes, 75 % of each prompt (bench-peers')
    prefixes = [tuple(rng.getrandbits(64) for _ in range(shared)) for _ in range(GROUPS)]
    key_spec = SimpleNamespace(salt="deployment-salt", tenant_header="X-Tenant")
    variant = SimpleNamespace(name="default", routing_config=SimpleNamespace(key=key_spec))
    body = b'{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,' + (
        b'"message":{"role":"assistant","content":"' + b"x" * 256 + b'"},"finish_reason":'
        b'"length"}],' + USAGE
    )
    out = []
    for i in range(count):
        unique = tuple(rng.getrandbits(64) for _ in range(blocks - shared))
        hashes = prefixes[rng.randrange(GROUPS)] + unique  # chained: equal prefix, equal ids
        key = RoutingKey(hashes, BLOCK_CHARS, PROMPT_CHARS, PROMPT_CHARS // 4, rng.getrandbits(64),
                         output_tokens_hint=64)  # fmt: skip
        decision = Decision(f"emu-{i % 4}", Reason.PREFIX_HIT, predicted_cached_blocks=blocks // 2)
        call = SimpleNamespace(
            model="tiny", variant=variant, key=key, decision=decision, t_start=time.perf_counter(),
            ticket=None,
            inst=SimpleNamespace(instance_id=decision.instance_id),
            request=SimpleNamespace(headers={"content-type": "application/json", "host": "h"}),
        )  # fmt: skip
        relay = SimpleNamespace(last=body, tail=b"", t_first=call.t_start + 0.01)
        out.append((cast("Attempt", call), cast("Relay", relay)))
    return out


def _capture(directory: Path, name: str, queue_size: int) -> Capture:
    config = CaptureConfig(path=str(directory / name), queue_size=queue_size, keep_files=0)
    return Capture(config, CaptureMetrics(CollectorRegistry()), lambda: HEADER)


def _cpu_us(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) / calls * 1e6


def request_path_round(reqs: list[tuple[Attempt, Relay]], directory: Path) -> tuple[float, float]:
    """(off, on) µs per call: the proxy's loop over answered requests without, then with,
    ``Capture.offer`` (the queue is emptied afterwards, nothing written)."""
    capture = _capture(directory, "path.jsonl", len(reqs) + 1)
    none: Capture | None = None

    def loop(cap: Capture | None) -> None:
        for call, relay in reqs:
            if cap is not None:
                cap.offer(call, relay, 200)

    off = _cpu_us(lambda: loop(none), len(reqs))
    on = _cpu_us(lambda: loop(capture), len(reqs))
    capture._queue.clear()  # a benchmark: what was queued is not written
    return off, on


def writer_round(items: list[Captured], directory: Path, batch: int) -> float:
    """µs per line: the writer's ``CaptureFile.write`` over ``items`` in batches."""
    capture = _capture(directory, "writer.jsonl", 1)

    def write() -> None:
        for start in range(0, len(items), batch):
            capture.file.write(items[start : start + batch], HEADER)

    per_line = _cpu_us(write, len(items))
    capture.file.close()
    return per_line


async def _serve(reqs: list[tuple[Attempt, Relay]], capture: Capture | None, rate: float) -> None:
    """Offer ``reqs`` at ``rate`` per second (a burst every ``TICK_S``), then let the writer
    write everything out."""
    task = asyncio.create_task(capture.run()) if capture is not None else None
    per_tick = max(1, round(rate * TICK_S))
    for start in range(0, len(reqs), per_tick):
        for call, relay in reqs[start : start + per_tick]:
            if capture is not None:
                capture.offer(call, relay, 200)
        await asyncio.sleep(TICK_S)
    if capture is not None and task is not None:
        capture.close()
        await task


def total_round(
    reqs: list[tuple[Attempt, Relay]], directory: Path, rate: float
) -> tuple[float, float]:
    """(off, on) µs per request: the serving loop with capture off, then on."""

    def run(capture: Capture | None) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(reqs, capture, rate))

    off = _cpu_us(lambda: run(None), len(reqs))
    capture = _capture(directory, "total.jsonl", 65536)
    on = _cpu_us(lambda: run(capture), len(reqs))
    lines = capture.metrics.lines.value
    if lines != len(reqs):
        raise RuntimeError(f"the capture wrote {lines} lines for {len(reqs)} requests")
    return off, on


def _items(reqs: list[tuple[Attempt, Relay]], directory: Path) -> list[Captured]:
    capture = _capture(directory, "items.jsonl", len(reqs) + 1)
    for call, relay in reqs:
        capture.offer(call, relay, 200)
    return list(capture._queue)  # the items the writer would get


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    reqs = _requests(args.requests)
    items = _items(reqs, directory)
    path, writer, total = [], [], []
    for _ in range(args.rounds):
        off, on = request_path_round(reqs, directory)
        path.append(on - off)
        writer.append(writer_round(items, directory, args.batch))
        off, on = total_round(reqs, directory, args.rate)
        total.append(on - off)
    return {
        "requests": args.requests, "rounds": args.rounds, "rate_per_s": args.rate,
        "batch": args.batch, "blocks_per_key": PROMPT_CHARS // BLOCK_CHARS,
        "request_path_us": statistics.median(path), "request_path_us_rounds": path,
        "writer_us": statistics.median(writer), "writer_us_rounds": writer,
        "total_us": statistics.median(total), "total_us_rounds": total,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.capture_cost")
    parser.add_argument("--out", type=Path, default=Path("bench-results/capture-cost.json"))
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="warmfleet-capture-cost-") as tmp:
        figures = measure(args, Path(tmp))
    merge_into(args.out, {"capture_cost": figures})
    print(
        f"capture CPU per request (median of {args.rounds} rounds of {args.requests}): "
        f"request path {figures['request_path_us']:.2f} µs, writer {figures['writer_us']:.2f} "
        f"µs a line, total (event loop + writer thread) {figures['total_us']:.2f} µs"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover - the Makefile's entry point
    sys.exit(main())
