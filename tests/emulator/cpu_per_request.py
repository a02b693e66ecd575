"""Emulator CPU per request, side by side with a bare aiohttp server (not a test; a tool).

    .venv/bin/python tests/emulator/cpu_per_request.py \
        [--variant NAME=SRC_DIR ...] [--rounds 2] [--requests 1500]

Each server runs as a child process with 4 listeners on 127.0.0.1 (uvloop, like
``warmfleet emulate``): ``bare`` answers every POST with a canned response (JSON, or the whole
SSE body in one write); each ``--variant`` is ``warmfleet emulate`` (tiny-cpu, speed-up 10,000:
engine time ~0) imported from SRC_DIR (default: this tree's ``src``; e.g. a ``git archive`` of
HEAD for "before"). The client (this process) sends the peer benchmark's ~8,000-character chat
prompts (``bench.peers.overhead_workload``: 8 shared prefixes, 16 output tokens), round robin
over the 4 ports, closed loop, after a warm-up. CPU = utime + stime of the server process
(/proc) over the measured requests. Servers are started fresh per point and stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from warmfleet.bench.loadgen import LoadSpec, prepare_requests
from warmfleet.bench.peers import overhead_workload

_REPO = Path(__file__).resolve().parents[2]
_BARE = r"""
import asyncio, json, sys, uvloop
from aiohttp import web
body = json.dumps({"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "the warm fast keep"},
    "finish_reason": "length"}], "usage": {"prompt_tokens": 2000, "completion_tokens": 16,
    "total_tokens": 2016, "prompt_tokens_details": {"cached_tokens": 1504}}}).encode()
chunk = (b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":0,'
    b'"model":"m","choices":[{"index":0,"delta":{"content":" warm"},"logprobs":null,'
    b'"finish_reason":null}]}\n\n')
sse = chunk * 17 + b'data: {"choices":[],"usage":{"prompt_tokens":2000}}\n\ndata: [DONE]\n\n'
async def handle(request):
    data = await request.json()
    if data.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write_eof(sse)
        return resp
    return web.Response(body=body, content_type="application/json")
async def main():
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports = []
    for _ in range(4):
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])
    print(json.dumps({"urls": [f"http://127.0.0.1:{p}" for p in ports]}), flush=True)
    await asyncio.Event().wait()
uvloop.run(main())
"""
_EMU = "import typer; from warmfleet.emulator.cli import emulate_command as f; typer.run(f)"
POINTS = {"c1": (1, False), "c32": (32, False), "stream_c32": (32, True)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(name: str, src: str | None) -> tuple[subprocess.Popen[bytes], list[str]]:
    env = dict(os.environ)
    if src is None:
        argv = [sys.executable, "-c", _BARE]
    else:
        env["PYTHONPATH"] = src
        argv = [sys.executable, "-c", _EMU, "--instances", "4", "--preset", "tiny-cpu",
                "--time-scale", "10000", "--model", "model"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"{name} did not start")
    return proc, list(json.loads(line)["urls"])


async def _drive(urls: list[str], bodies: list[bytes], concurrency: int) -> int:
    errors = 0
    next_index = 0
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            nonlocal next_index, errors
            while next_index < len(bodies):
                i = next_index
                next_index += 1
                url = urls[i % len(urls)] + "/v1/chat/completions"
                async with session.post(url, data=bodies[i], headers=headers) as resp:
                    await resp.read()
                    errors += resp.status != 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return errors


def _measure(name: str, src: str | None, point: str, requests: int) -> dict[str, float]:
    concurrency, stream = POINTS[point]
    spec = LoadSpec(urls=("x",), model="model", stream=stream, max_output_tokens=16,
                    ignore_eos=True)  # fmt: skip
    prepared = prepare_requests(overhead_workload(requests + 64, seed=7), spec)
    bodies = [p.body for p in prepared]
    proc, urls = _start(name, src)
    try:
        import uvloop  # noqa: PLC0415

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_drive(urls, bodies[:64], min(concurrency, 8)))  # warm-up
            cpu0, t0 = _cpu_s(proc.pid), time.perf_counter()
            errors = runner.run(_drive(urls, bodies[64:], concurrency))
            cpu1, t1 = _cpu_s(proc.pid), time.perf_counter()
    finally:
        proc.terminate()
        proc.wait(10)
    return {"cpu_ms_per_req": 1000 * (cpu1 - cpu0) / requests,
            "req_per_s": requests / (t1 - t0), "errors": errors}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--points", default="c1,c32,stream_c32")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    servers: list[tuple[str, str | None]] = [("bare", None)]
    for item in args.variant or [f"emulator={_REPO / 'src'}"]:
        name, _, src = item.partition("=")
        servers.append((name, str(Path(src).resolve())))
    results: dict[str, dict[str, list[float]]] = {}
    for _round in range(args.rounds):
        for point in args.points.split(","):
            n = args.requests // 5 if point == "c1" else args.requests
            for name, src in servers:
                r = _measure(name, src, point, n)
                results.setdefault(point, {}).setdefault(name, []).append(r["cpu_ms_per_req"])
                cpu, rate, errors = r["cpu_ms_per_req"], r["req_per_s"], r["errors"]
                line = f"{point:11s} {name:10s} {cpu:.3f} ms/req {rate:7.0f} req/s errors={errors}"
                print(line, flush=True)
    print("\nmedian CPU ms/request (ratio to bare):")
    for point, by_name in results.items():
        bare = sorted(by_name["bare"])[len(by_name["bare"]) // 2]
        cells = []
        for name, values in by_name.items():
            med = sorted(values)[len(values) // 2]
            cells.append(f"{name} {med:.3f} ({med / bare:.1f}x)")
        print(f"  {point:11s} " + "  ".join(cells))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
