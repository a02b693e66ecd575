"""The weights the engines load: a node cache the warmfleet agent fills from an origin.

The tiny model (``make vllm-model``) is uploaded to an S3-compatible origin (``moto_server``, a
child process on 127.0.0.1); ``warmfleet cache prefetch s3://models/tiny-llama/`` (the agent's
own CLI, in its own process) resolves, downloads, verifies and publishes it into a fresh node
cache; then the origin is stopped, so when vLLM starts (``--model`` = the published object
directory) its config, tokenizer and safetensors can only come from the cache. The figures go
into ``e2e-vllm.json`` (``weights_from_cache``, ``cache_fill``).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.bench.live_procs import ProcessSet, command_argv, free_port, wait_ready
from warmfleet.cache.config import CapacitySpec, NodeCacheConfig, NodeCacheSpec, SourcesSpec

BUCKET = "models"
PREFIX = "tiny-llama/"
FILL_TIMEOUT_S = 300.0
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "e2e", "AWS_SECRET_ACCESS_KEY": "e2e"}


@dataclass(frozen=True)
class CacheFill:
    model_dir: Path  # the published object directory the engines load
    figures: dict[str, Any]


def _upload(endpoint: str, model_dir: Path) -> tuple[int, int]:
    """Every regular file of the model (not the build's dot files); (files, bytes)."""
    import boto3  # noqa: PLC0415 (the harness's own dependency, imported where used)

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    files = [p for p in sorted(model_dir.iterdir()) if p.is_file() and not p.name.startswith(".")]
    for path in files:
        client.upload_file(str(path), BUCKET, PREFIX + path.name)
    return len(files), sum(p.stat().st_size for p in files)


def _node_config(root: Path, endpoint: str) -> Path:
    spec = NodeCacheSpec(
        root=str(root),
        capacity=CapacitySpec(budget=1 << 30),
        sources=SourcesSpec(s3_endpoint_url=endpoint),
    )
    doc = NodeCacheConfig(spec=spec).model_dump(mode="json", by_alias=True)
    path = root.parent / "node.yaml"
    path.write_text(json.dumps(doc, indent=2) + "\n")  # YAML is a superset of JSON
    return path


def reachable(endpoint: str) -> bool:
    host, port = endpoint.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


async def _prefetch(config: Path, log_dir: Path) -> tuple[dict[str, Any], float]:
    """``warmfleet cache prefetch`` in its own process: (its JSON record, seconds)."""
    argv = command_argv("warmfleet.agent.cli", "prefetch", f"s3://{BUCKET}/{PREFIX}")
    argv += ["--config", str(config), "--name", "tiny-llama", "--pin", "--json"]
    started = time.perf_counter()
    with (log_dir / "cache-prefetch.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=log, env={**os.environ, **CREDENTIALS}
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), FILL_TIMEOUT_S)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    took_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"warmfleet cache prefetch failed ({proc.returncode}): see {log.name}")
    record: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return record, took_s


async def fill_node_cache(model_dir: Path, node_dir: Path, procs: ProcessSet) -> CacheFill:
    """Origin up, upload, agent fill, origin down; the engines' model directory + figures."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    moto = str(Path(sys.executable).parent / "moto_server")
    port = endpoint.rsplit(":", 1)[1]
    origin = procs.start("origin-moto", [moto, "-H", "127.0.0.1", "-p", port], CREDENTIALS)
    try:
        await wait_ready(f"{endpoint}/", origin, timeout_s=60.0, accept=(200, 403, 404))
        for name, value in CREDENTIALS.items():
            os.environ.setdefault(name, value)
        files, size = await asyncio.to_thread(_upload, endpoint, model_dir)
        root = node_dir / "cache"
        record, fill_s = await _prefetch(_node_config(root, endpoint), procs.log_dir)
    finally:
        procs.stop(origin)  # the origin's copy (moto keeps objects in memory) is gone
    published = root / "objects" / record["key"]
    if record["size_bytes"] != size or not (published / "model.safetensors").is_file():
        raise RuntimeError(f"the node cache does not hold the model: {record}")
    figures = {
        "origin": "s3 (moto_server on 127.0.0.1), stopped before the engines start",
        "origin_reachable_at_engine_start": reachable(endpoint),
        "uri": f"s3://{BUCKET}/{PREFIX}",
        "files": files,
        "bytes": size,
        "seconds": round(fill_s, 3),
        "gbps": round(size / fill_s / 1e9, 4),
        "note": "warmfleet cache prefetch as a process: resolve, download, verify, publish",
        "key": record["key"],
        "model_dir": str(published),
    }
    return CacheFill(published, figures)


async def engines_model_roots(urls: list[str]) -> list[str]:
    """What each engine says it loaded (``root`` of ``GET /v1/models``)."""
    roots: list[str] = []
    timeout = aiohttp.ClientTimeout(total=30.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for url in urls:
            async with session.get(f"{url}/v1/models") as resp:
                body = await resp.json()
            roots.extend(str(m.get("root")) for m in body.get("data", []))
    return roots


def weights_from_cache(fill: CacheFill, roots: list[str]) -> bool:
    """Every engine loaded the published cache directory and the origin was unreachable."""
    cache_dir = str(fill.model_dir)
    loaded = bool(roots) and all(root == cache_dir for root in roots)
    return loaded and not fill.figures["origin_reachable_at_engine_start"]
