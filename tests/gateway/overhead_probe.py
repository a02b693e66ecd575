"""Indicative overhead probe (not a test; not a benchmark of record).

    .venv/bin/python tests/gateway/overhead_probe.py [--strategy prefix_affinity] [--requests N]

Starts 4 fake OpenAI backends in one subprocess and the gateway (`warmfleet serve`) in another,
then from this process (aiohttp + uvloop, keep-alive) measures direct (client round-robins over
the backends) vs through the gateway: p50/p99 latency at c=1 and c=32 with ~8,000-character chat
prompts, streamed TTFT at c=32, and the gateway process's CPU time per proxied request
(utime+stime from /proc). Everything shares one small machine, so treat the numbers as
indicative only; `warmfleet bench` / `make bench-peers` are the measurements of record.
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

# The reference point of the acceptance criteria: aiohttp + uvloop pass-through, no routing logic.
BARE_PROXY_SCRIPT = """
import itertools, sys
import aiohttp, uvloop
from aiohttp import web
urls = sys.argv[1:]
async def main():
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    rr = itertools.cycle(urls)
    async def handle(request):
        body = await request.read()
        async with session.post(next(rr) + request.path, data=body,
                                headers={"Content-Type": "application/json"}) as up:
            if up.content_length is not None:
                return web.Response(body=await up.read(), status=up.status,
                                    headers={"Content-Type": up.headers["Content-Type"]})
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": up.headers["Content-Type"]})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print("http://127.0.0.1:%d" % runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()
import asyncio
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


def _start_gateway(urls: list[str], strategy: str, tmp: Path) -> tuple[subprocess.Popen[str], str]:
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
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    exe = Path(sys.executable).parent / "warmfleet"
    proc = subprocess.Popen(
        [str(exe), "serve", "--config", str(path), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        text=True,
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


async def main(args: argparse.Namespace) -> dict[str, Any]:
    backends, urls = _start_backends()
    bare = subprocess.Popen(
        [sys.executable, "-c", BARE_PROXY_SCRIPT, *urls], stdout=subprocess.PIPE, text=True
    )
    assert bare.stdout is not None
    bare_url = bare.stdout.readline().strip()
    with tempfile.TemporaryDirectory() as tmp:
        gateway, gw_url = _start_gateway(urls, args.strategy, Path(tmp))
        try:
            report: dict[str, Any] = {"strategy": args.strategy}
            for label, conc, n, stream in (
                ("c1", 1, args.requests, False),
                ("c32", 32, args.requests * 4, False),
                ("c32_stream", 32, args.requests * 2, True),
            ):
                direct = await _run(urls, n, conc, stream)
                via_bare = await _through(bare, bare_url, n, conc, stream)
                via = await _through(gateway, gw_url, n, conc, stream)
                report[label] = {
                    "direct": direct,
                    "bare_proxy": via_bare,
                    "gateway": via,
                    "added_p50_ms": via["p50_ms"] - direct["p50_ms"],
                    "bare_added_p50_ms": via_bare["p50_ms"] - direct["p50_ms"],
                    "ttft_added_p50_ms": via["ttft_p50_ms"] - direct["ttft_p50_ms"],
                    "throughput_vs_direct": via["rps"] / direct["rps"],
                    "gateway_cpu_ms_per_request": via["cpu_ms_per_request"],
                    "bare_cpu_ms_per_request": via_bare["cpu_ms_per_request"],
                }
            return report
        finally:
            for proc in (gateway, bare, backends):
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="prefix_affinity")
    parser.add_argument("--requests", type=int, default=1000)
    result = uvloop.run(main(parser.parse_args()))
    print(json.dumps(result, indent=2))
