"""Indicative overhead probe (not a test; not a benchmark of record).

    .venv/bin/python tests/gateway/overhead_probe.py [--strategy prefix_affinity] [--requests N]
        [--rounds R] [--gateway-src LABEL=PATH ...] [--flow]

Starts 4 fake OpenAI backends in one subprocess and the gateway (`warmfleet serve`) in another,
then from this process (aiohttp + uvloop, keep-alive) measures direct (client round-robins over
the backends) vs a bare aiohttp pass-through proxy (``warmfleet.bench.passthrough``) vs the
same pass-through on uvloop protocols + httptools (``raw_proxy``:
``warmfleet.bench.protocol_passthrough``) vs through the gateway:
p50/p99 latency at c=1 and c=32 with ~8,000-character chat prompts, streamed TTFT at c=32, and
the gateway process's CPU time per proxied request (utime+stime from /proc).
``--gateway-src old=/tmp/old/src`` adds a gateway that imports warmfleet from another source
tree (e.g. a snapshot before a change), measured in the same run against the same backends, so
before/after ratios share the machine's noise; ``--flow`` adds ``gateway+flow``, the same
gateway with ``routing.flow`` on and a cap no request reaches (flow control's cost without
overload); ``--rounds`` repeats every target (medians
kept, gateway order rotated each round). Everything shares one small machine, so treat the
numbers as indicative only; `warmfleet bench` / `make bench-peers` are the measurements of
record.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
import yaml

HERE = Path(__file__).resolve().parent
BACKENDS_SCRIPT = """
import asyncio, sys
sys.path.insert(0, %r)
import uvloop
from gateway_support import FakeBackend
async def main():
    bs = [FakeBackend(f"b{i}", chunks=16) for i in range(4)]
    for b in bs:
        await b.start()
    print(" ".join(b.url for b in bs), flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _prompt(i: int) -> str:
    shared = f"group {i % 8} shared context " * 230  # ~6,000 shared characters
    return shared + f" unique question {i} " * 100  # ~2,000 unique characters


async def _one(
    session: aiohttp.ClientSession, url: str, i: int, stream: bool
) -> tuple[float, float]:
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": _prompt(i)}],
        "stream": stream,
        "max_tokens": 16,
    }
    t0 = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        first = await resp.content.readany()
        ttft = time.perf_counter() - t0
        assert resp.status == 200
        assert first
        await resp.read()
    return time.perf_counter() - t0, ttft


async def _run(urls: list[str], n: int, concurrency: int, stream: bool) -> dict[str, float]:
    latencies: list[float] = []
    ttfts: list[float] = []
    counter = iter(range(n))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for i in counter:
                lat, ttft = await _one(session, urls[i % len(urls)], i, stream)
                latencies.append(lat)
                ttfts.append(ttft)

        for i in range(min(64, n)):  # warm-up (connections, caches)
            await _one(session, urls[i % len(urls)], i, stream)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=100)
    tq = statistics.quantiles(ttfts, n=100)
    return {
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
        "ttft_p50_ms": tq[49] * 1e3,
        "rps": n / wall,
    }


def _start_backends() -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BACKENDS_SCRIPT % str(HERE)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split()


def _start_gateway(
    urls: list[str],
    strategy: str,
    tmp: Path,
    src: str | None = None,
    flow: dict[str, Any] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """``warmfleet serve`` in front of ``urls``; ``src``: import warmfleet from that source tree
    (a snapshot of another version, to compare two builds side by side in one run)."""
    doc: dict[str, Any] = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "listen": {"host": "127.0.0.1", "port": 0},
            "endpoints": [
                {
                    "name": "main",
                    "variants": [
                        {
                            "name": "v1",
                            "models": ["fake-model"],
                            "routing": {"strategy": {"type": strategy}},
                            "instances": [{"id": f"b{i}", "url": u} for i, u in enumerate(urls)],
                        }
                    ],
                }
            ],
        },
    }
    if flow is not None:
        doc["spec"]["endpoints"][0]["variants"][0]["routing"]["flow"] = flow
    path = tmp / f"gateway-{abs(hash((src, flow is None)))}.yaml"
    path.write_text(yaml.safe_dump(doc))
    exe = Path(sys.executable).parent / "warmfleet"
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    proc = subprocess.Popen(
        [str(exe), "serve", "--config", str(path), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip().rsplit(" ", 1)[-1]


async def _through(
    proc: subprocess.Popen[str], url: str, n: int, conc: int, stream: bool
) -> dict[str, float]:
    cpu0 = _cpu_s(proc.pid)
    result = await _run([url], n, conc, stream)
    result["cpu_ms_per_request"] = (_cpu_s(proc.pid) - cpu0) * 1e3 / (n + min(64, n))
    return result


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


async def _point(
    targets: dict[str, tuple[subprocess.Popen[str] | None, list[str]]],
    n: int,
    conc: int,
    stream: bool,
    rounds: int,
) -> dict[str, dict[str, float]]:
    """Every target once per round (direct and the bare proxy first, then the gateways in an
    order rotated each round); per target the median of its rounds."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
    names = list(targets)
    fixed, gateways = names[:2], names[2:]
    for r in range(rounds):
        k = r % len(gateways) if gateways else 0
        for name in [*fixed, *gateways[k:], *gateways[:k]]:
            proc, urls = targets[name]
            if proc is None:
                runs[name].append(await _run(urls, n, conc, stream))
            else:
                runs[name].append(await _through(proc, urls[0], n, conc, stream))
    return {name: _median_run(r) for name, r in runs.items()}


def _row(direct: dict[str, float], bare: dict[str, float], via: dict[str, float]) -> dict[str, Any]:
    return {
        "added_p50_ms": via["p50_ms"] - direct["p50_ms"],
        "ttft_added_p50_ms": via["ttft_p50_ms"] - direct["ttft_p50_ms"],
        "throughput_vs_direct": via["rps"] / direct["rps"],
        "cpu_ms_per_request": via["cpu_ms_per_request"],
        "cpu_vs_bare": via["cpu_ms_per_request"] / bare["cpu_ms_per_request"],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    backends, urls = _start_backends()
    bare = subprocess.Popen(
        [sys.executable, "-m", "warmfleet.bench.passthrough", *urls],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert bare.stdout is not None
    bare_url = bare.stdout.readline().strip()
    procs: list[subprocess.Popen[str]] = [backends, bare]
    with tempfile.TemporaryDirectory() as tmp:
        try:
            targets: dict[str, tuple[subprocess.Popen[str] | None, list[str]]] = {
                "direct": (None, urls),
                "bare_proxy": (bare, [bare_url]),
            }
            raw = subprocess.Popen(
                [sys.executable, "-m", "warmfleet.bench.protocol_passthrough", *urls],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(raw)
            assert raw.stdout is not None
            targets["raw_proxy"] = (raw, [raw.stdout.readline().strip()])
            for name, src in [("gateway", None), *args.gateway_src]:
                gateway, gw_url = _start_gateway(urls, args.strategy, Path(tmp), src)
                procs.append(gateway)
                targets[name] = (gateway, [gw_url])
            if args.flow:
                flow = {"maxInFlightPerInstance": 4096, "enginePreset": "tiny-cpu"}
                gateway, gw_url = _start_gateway(urls, args.strategy, Path(tmp), None, flow)
                procs.append(gateway)
                targets["gateway+flow"] = (gateway, [gw_url])
            report: dict[str, Any] = {"strategy": args.strategy, "rounds": args.rounds}
            for label, conc, n, stream in (
                ("c1", 1, args.requests, False),
                ("c32", 32, args.requests * 4, False),
                ("c32_stream", 32, args.requests * 2, True),
            ):
                res = await _point(targets, n, conc, stream, args.rounds)
                direct, via_bare, via = res["direct"], res["bare_proxy"], res["gateway"]
                report[label] = {
                    **res,
                    "added_p50_ms": via["p50_ms"] - direct["p50_ms"],
                    "bare_added_p50_ms": via_bare["p50_ms"] - direct["p50_ms"],
                    "ttft_added_p50_ms": via["ttft_p50_ms"] - direct["ttft_p50_ms"],
                    "throughput_vs_direct": via["rps"] / direct["rps"],
                    "gateway_cpu_ms_per_request": via["cpu_ms_per_request"],
                    "bare_cpu_ms_per_request": via_bare["cpu_ms_per_request"],
                    "gateway_cpu_vs_bare": via["cpu_ms_per_request"]
                    / via_bare["cpu_ms_per_request"],
                    "rows": {name: _row(direct, via_bare, res[name]) for name in list(targets)[1:]},
                }
            return report
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(10)


def _label_path(text: str) -> tuple[str, str]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError("expected LABEL=PATH")
    return label, path


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="prefix_affinity")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs per target and load point (medians kept)"
    )
    parser.add_argument(
        "--gateway-src",
        type=_label_path,
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="also measure a gateway importing warmfleet from PATH (e.g. a snapshot of src/)",
    )
    parser.add_argument("--flow", action="store_true", help="also measure gateway+flow")
    result = uvloop.run(main(parser.parse_args()))
    print(json.dumps(result, indent=2))
