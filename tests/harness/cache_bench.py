"""``make bench-cache``: throughput and fault runs of the node cache, written as JSON.

* HTTP: a throttled local origin (the local fleet's, ``warmfleet.local.origin_proc``, in a
  separate process); achieved prefetch rate / throttle rate.
* Local path and S3 (moto server, separate process): GB/s next to baselines measured in the same
  run (``cp`` and ``cp`` + fsync for the local path, medians of rounds side by side; a plain
  boto3 ``download_file`` for S3).
* Faults: kill -9 mid-download (N times in a row), truncated bodies, 503s, a flipped byte at
  the origin, a full tmpfs, an object changed during and between downloads. Every cache root is
  audited afterwards; ``corrupt_or_partial_published`` counts what should never exist.
* Big model (acceptance 3): a sparse synthetic model (default 5 GB) is prefetched, fully
  verified, evicted by LRU admission and re-fetched within a disk budget; peak disk use sampled.

``python -m harness.cache_bench --out bench-results/cache.json`` with ``tests`` on
``PYTHONPATH`` (``make bench-cache``). A benchmark harness, not part of the installed package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from harness.bench_support import GB, MB, manager_for, write_pseudo_random
from harness.faults import run_fault_matrix
from harness.local_bench import bench_local
from harness.registry import stop_process
from warmfleet.bench.live_procs import free_port
from warmfleet.cache.config import SourcesSpec


@contextlib.contextmanager
def child(cmd: list[str], ready_url: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if ready_url is not None:
            _wait_http(ready_url, proc)
        yield proc
    finally:
        stop_process(proc)


def _wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url}: server did not start")


def _wait_ready_file(path: Path, proc: subprocess.Popen[bytes]) -> str:
    """The URL the origin announces in its ready file."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"origin exited with {proc.returncode}")
        with contextlib.suppress(OSError, ValueError):
            url: str = json.loads(path.read_text())["url"]
            return url
        time.sleep(0.1)
    raise RuntimeError("origin did not start")


# ----- HTTP throttled origin ----------------------------------------------------------------
async def bench_http(work: Path, size: int, throttle_bps: float, reps: int = 3) -> dict[str, Any]:
    """Median of ``reps`` prefetches (fresh cache each time) through one throttled origin."""
    served = work / "http-origin"
    served.mkdir()
    src = served / "w.bin"
    write_pseudo_random(src, size)
    ready = work / "http-origin.json"
    cmd = [
        sys.executable,
        "-m",
        "warmfleet.local.origin_proc",
        "--dir",
        str(served),
        "--ready-file",
        str(ready),
        "--throttle",
        str(throttle_bps),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = []
    try:
        url = _wait_ready_file(ready, proc)
        for _ in range(reps):
            load = os.getloadavg()[0]
            cpu0 = time.process_time()
            async with manager_for(work / "http-cache") as m:
                t0 = time.perf_counter()
                await m.prefetch(f"{url}/files/w.bin")
                elapsed = time.perf_counter() - t0
            runs.append(
                {
                    "elapsed_s": round(elapsed, 3),
                    "fraction": round(size / elapsed / throttle_bps, 4),
                    "client_cpu_s": round(time.process_time() - cpu0, 2),
                    "loadavg_1m": round(load, 2),
                }
            )
            shutil.rmtree(work / "http-cache", ignore_errors=True)
    finally:
        stop_process(proc)
    shutil.rmtree(served)
    fractions = sorted(r["fraction"] for r in runs)
    return {
        "size_bytes": size,
        "throttle_bps": throttle_bps,
        "fraction": fractions[len(fractions) // 2],
        "best_fraction": fractions[-1],
        "runs": runs,
        "note": "end to end (resolve + download + verify + publish); median of runs",
    }


# ----- S3 (moto server) vs boto3 download_file --------------------------------------------------
async def bench_s3(work: Path, size: int) -> dict[str, Any]:
    import boto3  # noqa: PLC0415

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(var, "bench")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    src = work / "s3-src.bin"
    write_pseudo_random(src, size)
    with child([moto, "-H", "127.0.0.1", "-p", str(port)], ready_url=endpoint):
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        client.upload_file(str(src), "bench", "model/w.bin")
        src.unlink()
        dst = work / "boto3-copy.bin"
        t0 = time.perf_counter()
        client.download_file("bench", "model/w.bin", str(dst))
        base_s = time.perf_counter() - t0
        dst.unlink()
        sources = SourcesSpec(s3_endpoint_url=endpoint)
        async with manager_for(work / "s3-cache", sources=sources) as m:
            t0 = time.perf_counter()
            await m.prefetch("s3://bench/model/")
            ours_s = time.perf_counter() - t0
    shutil.rmtree(work / "s3-cache", ignore_errors=True)
    return {
        "size_bytes": size,
        "prefetch_s": round(ours_s, 3),
        "gbps": round(size / ours_s / GB, 3),
        "baseline_boto3_download_file_s": round(base_s, 3),
        "baseline_boto3_download_file_gbps": round(size / base_s / GB, 3),
        "note": "moto_server is a single Python process: both figures are origin-bound",
    }


# ----- big sparse model: prefetch, verify, evict, re-fetch within budget --------------------------
class DiskSampler:
    """Samples the bytes allocated under a directory (st_blocks) in a thread."""

    def __init__(self, root: Path, period_s: float = 0.25) -> None:
        self.root, self.period_s, self.peak_bytes = root, period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _used(self) -> int:
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak_bytes = max(self.peak_bytes, self._used())

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._used())


def make_sparse_model(root: Path, size: int, shards: int) -> None:
    """Sparse shards with a random 1 MiB stamp every 256 MiB (cheap to create, real to copy)."""
    root.mkdir(parents=True)
    per = size // shards
    for i in range(shards):
        with (root / f"model-{i:05d}-of-{shards:05d}.safetensors").open("wb") as fh:
            fh.truncate(per if i < shards - 1 else size - per * (shards - 1))
            for off in range(0, per, 256 << 20):
                fh.seek(off)
                fh.write(os.urandom(1 << 20))
    (root / "config.json").write_text(json.dumps({"synthetic": True, "bytes": size}))


async def bench_big(work: Path, size: int) -> dict[str, Any]:
    big_src, other_src, root = work / "big-src", work / "other-src", work / "big-cache"
    make_sparse_model(big_src, size, shards=max(1, size // (2 * GB)))
    make_sparse_model(other_src, max(size // 5, MB), shards=1)
    budget = int(size * 1.1)  # room for the model, not for the model + the other one
    root.mkdir()
    out: dict[str, Any] = {"size_bytes": size, "budget_bytes": budget}
    with DiskSampler(root) as sampler:
        async with manager_for(root, budget=budget) as m:
            t0 = time.perf_counter()
            first = await m.prefetch(str(big_src), name="big")
            out["prefetch_s"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            results = await m.verify(full=True)
            out["verify_full_s"] = round(time.perf_counter() - t0, 2)
            out["verify_full_ok"] = all(r.ok for r in results)
            t0 = time.perf_counter()
            await m.prefetch(str(other_src), name="other")  # does not fit beside it -> LRU
            out["evicted_by_admission"] = not m.store.is_published(first.key)
            out["other_prefetch_s"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            again = await m.prefetch(str(big_src), name="big")
            out["refetch_s"] = round(time.perf_counter() - t0, 2)
            out["refetch_same_key"] = again.key == first.key
            out["refetch_verify_ok"] = all(r.ok for r in await m.verify(full=False))
            out["evictions"] = int(m.metrics.evictions._value.get())
    out["peak_disk_bytes"] = sampler.peak_bytes
    out["within_budget"] = sampler.peak_bytes <= budget
    out["prefetch_gbps"] = round(size / out["prefetch_s"] / GB, 3)
    for d in (big_src, other_src, root):
        shutil.rmtree(d, ignore_errors=True)
    return out


@dataclass(frozen=True)
class BenchParams:
    """What ``make bench-cache`` measures (bytes, bytes/s, rounds)."""

    workdir: Path
    http_size: int
    http_throttle_bps: float
    local_size: int
    s3_size: int
    big_size: int
    kills: int


async def run(params: BenchParams) -> dict[str, Any]:
    params.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "machine": {"nproc": os.cpu_count(), "loadavg_at_start": os.getloadavg()}
    }
    with tempfile.TemporaryDirectory(dir=params.workdir, prefix="cache-bench-") as tmp:
        work = Path(tmp)
        print("faults ...", flush=True)
        faults = await run_fault_matrix(work / "faults", kills=params.kills)
        result["faults_injected"] = faults["faults_injected"]
        result["corrupt_or_partial_published"] = faults["corrupt_or_partial_published"]
        result["faults"] = faults
        print("http ...", flush=True)
        http = await bench_http(work, params.http_size, params.http_throttle_bps)
        result["http_throttle_fraction"] = http["fraction"]
        result["http"] = http
        print("local ...", flush=True)
        local = await bench_local(work, params.local_size)
        result["local_gbps"] = local["gbps"]
        result["local_baseline_cp_gbps"] = local["baseline_cp_gbps"]
        result["local_baseline_cp_fsync_gbps"] = local["baseline_cp_fsync_gbps"]
        result["local_ratio_to_cp_fsync"] = local["ratio_to_cp_fsync"]
        result["local"] = local
        print("s3 ...", flush=True)
        s3 = await bench_s3(work, params.s3_size)
        result["s3_gbps"] = s3["gbps"]
        result["s3_baseline_boto3_gbps"] = s3["baseline_boto3_download_file_gbps"]
        result["s3"] = s3
        if params.big_size > 0:
            print(f"big model ({params.big_size} bytes) ...", flush=True)
            result["big_model"] = await bench_big(work, params.big_size)
    return result


def cache_bench_command(
    out: Annotated[Path, typer.Option(help="JSON results")] = Path("bench-results/cache.json"),
    workdir: Annotated[Path, typer.Option(help="scratch space")] = Path("/var/tmp/warmfleet-bench"),
    http_size: Annotated[int, typer.Option(help="bytes through the HTTP origin")] = 300 * MB,
    http_throttle: Annotated[float, typer.Option(help="HTTP origin bytes/s")] = 50 * MB,
    local_size: Annotated[int, typer.Option(help="bytes copied from a local path")] = 2 * GB,
    s3_size: Annotated[int, typer.Option(help="bytes through moto's S3")] = 256 * MB,
    big_size: Annotated[int, typer.Option(help="the big sparse model (0: skip)")] = 5 * GB,
    kills: Annotated[int, typer.Option(help="kill -9 rounds in the fault matrix")] = 3,
) -> None:
    """Throughput and fault runs of the node cache, written as JSON."""
    params = BenchParams(workdir, http_size, http_throttle, local_size, s3_size, big_size, kills)
    result = asyncio.run(run(params))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    summary = {k: v for k, v in result.items() if not isinstance(v, dict)}
    print(json.dumps(summary, indent=2, sort_keys=True))


def main() -> None:
    typer.run(cache_bench_command)


if __name__ == "__main__":
    main()
