"""``make bench-cache``'s local-path figures: a prefetch beside ``cp`` and ``cp`` + fsync."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from harness.bench_support import GB, manager_for, warm, write_pseudo_random


def _timed_cp(src: Path, dst: Path, *, fsync: bool) -> float:
    warm(src)
    t0 = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    if fsync:  # cp + fsync: as durable as a published artifact
        subprocess.run(["sync", str(dst)], check=True)
    took_s = time.perf_counter() - t0
    subprocess.run(["sync", str(dst)], check=True)  # do not bill cp's dirty pages to the next
    dst.unlink()
    return took_s


async def _timed_fill(src_dir: Path, root: Path) -> tuple[float, float]:
    """(resolve s, total s) of one prefetch into an empty cache."""
    warm(src_dir / "model.safetensors")
    async with manager_for(root) as m:
        t0 = time.perf_counter()
        manifest = await m.resolve(str(src_dir))
        resolve_s = time.perf_counter() - t0
        await m.ensure(manifest, "local")
        total_s = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    return resolve_s, total_s


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


async def bench_local(work: Path, size: int, reps: int = 3) -> dict[str, Any]:
    """``reps`` rounds, each ``cp``, ``cp`` + fsync and a prefetch side by side (the source
    warm in the page cache before each); every figure is the median of its rounds."""
    src_dir = work / "local-src"
    src_dir.mkdir()
    src = src_dir / "model.safetensors"
    write_pseudo_random(src, size)
    dst = work / "cp-copy.bin"
    runs = []
    for _ in range(reps):
        cp_s = _timed_cp(src, dst, fsync=False)
        cp_sync_s = _timed_cp(src, dst, fsync=True)
        resolve_s, total_s = await _timed_fill(src_dir, work / "local-cache")
        runs.append(
            {
                "baseline_cp_s": round(cp_s, 3),
                "baseline_cp_fsync_s": round(cp_sync_s, 3),
                "prefetch_s": round(total_s, 3),
                "resolve_s": round(resolve_s, 3),
                "ratio_to_cp_fsync": round(cp_sync_s / total_s, 3),
                "loadavg_1m": round(os.getloadavg()[0], 2),
            }
        )
    shutil.rmtree(src_dir)
    med = {k: _median([r[k] for r in runs]) for k in runs[0]}
    gbps = size / med["prefetch_s"] / GB
    cp_sync_gbps = size / med["baseline_cp_fsync_s"] / GB
    return {
        "size_bytes": size,
        "reps": reps,
        "prefetch_s": round(med["prefetch_s"], 3),
        "resolve_s": round(med["resolve_s"], 3),
        "gbps": round(gbps, 3),
        "baseline_cp_s": round(med["baseline_cp_s"], 3),
        "baseline_cp_gbps": round(size / med["baseline_cp_s"] / GB, 3),
        "baseline_cp_fsync_s": round(med["baseline_cp_fsync_s"], 3),
        "baseline_cp_fsync_gbps": round(cp_sync_gbps, 3),
        "ratio_to_cp_fsync": round(gbps / cp_sync_gbps, 3),
        "median_run_ratio_to_cp_fsync": round(med["ratio_to_cp_fsync"], 3),
        "runs": runs,
        "note": (
            "median of rounds, each cp, cp + fsync and a prefetch side by side; resolve only "
            "stats, the sha256 is computed while copying and checked against the staged copy; "
            "cp alone leaves dirty pages in RAM, the cache fsyncs before it publishes"
        ),
    }
