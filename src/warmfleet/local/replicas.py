"""Engine replicas of the embedded fleet: one engine process per replica (``warmfleet emulate``,
or a real vLLM server under ``local.engine_proc``) that loads its weights (node cache when the
node was warm, else the origin) before it is ready; the gateway's instance files list the ready
replicas; a removed replica is drained, then stopped."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmfleet.control.observed import DesiredEndpoint, ObservedReplica
from warmfleet.local.config import EmulatorEngine, EngineConfig, VllmEngine
from warmfleet.local.procs import Child, emulate_argv, module_argv, start_child


@dataclass
class Replica:
    name: str
    deployment: str
    endpoint: str
    variant: str
    node: str
    prepared: bool
    load_source: str  # the node cache directory or the origin URL
    child: Child
    draining_since_s: float | None = None  # wall clock
    failed: bool = False
    standby: str | None = None  # warm standby (``standby``): parking, asleep or waking

    @property
    def parked(self) -> bool:
        """A warm standby (going to sleep, asleep, waking): not serving, not a pod."""
        return self.standby is not None

    @property
    def url(self) -> str | None:
        info = self.child.ready_info
        if not info:
            return None
        urls = info.get("urls") or []
        return str(urls[0]) if urls else None

    @property
    def ready(self) -> bool:
        return self.child.poll_ready() and self.child.alive

    def time_to_ready_s(self) -> float | None:
        if self.child.ready_wall_s is None:
            return None
        return self.child.ready_wall_s - self.child.started_wall_s

    def weights_load_s(self) -> float | None:
        weights = (self.child.ready_info or {}).get("weights") or {}
        value = weights.get("load_s")
        return float(value) if value is not None else None

    def weights_bytes(self) -> int | None:
        weights = (self.child.ready_info or {}).get("weights") or {}
        value = weights.get("bytes_read")
        return int(value) if value is not None else None

    def observed(self, t0_wall_s: float) -> ObservedReplica:
        ready_wall = self.child.ready_wall_s if self.ready else None
        return ObservedReplica(
            self.name,
            self.node,
            self.child.started_wall_s - t0_wall_s,
            None if ready_wall is None else ready_wall - t0_wall_s,
            self.prepared,
        )

    def summary(self) -> dict[str, Any]:
        state = "draining" if self.draining_since_s is not None else "starting"
        if self.ready and self.draining_since_s is None:
            state = "ready"
        if self.standby is not None:
            state = self.standby
        if self.failed or not self.child.alive:
            state = "exited"
        return {
            "name": self.name,
            "deployment": self.deployment,
            "endpoint": self.endpoint,
            "variant": self.variant,
            "node": self.node,
            "pid": self.child.pid,
            "state": state,
            "prepared": self.prepared,
            "url": self.url,
            "loadSource": "node-cache" if self.prepared else "origin",
            "timeToReadyS": self.time_to_ready_s(),
            "weightsLoadS": self.weights_load_s(),
            "weightsBytes": self.weights_bytes(),
        }


ENGINE_MODULE = "warmfleet.local.engine_proc"


def emulator_argv(engine: EmulatorEngine, model: str, load_source: str, ready: Path) -> list[str]:
    """``warmfleet emulate``: one instance that reads ``load_source`` before it is ready."""
    return emulate_argv(
        "--instances",
        "1",
        "--preset",
        engine.preset,
        "--speedup",
        str(engine.speedup),
        "--model",
        model,
        "--ports-file",
        str(ready),
        "--load-weights-from",
        load_source,
    )


def vllm_argv(engine: VllmEngine, model: str, model_dir: str) -> list[str]:
    """The vLLM server of one replica (``{port}``: the supervisor's free port)."""
    argv = [
        engine.python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--dtype",
        engine.dtype,
        "--max-model-len",
        str(engine.max_model_len),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    if engine.kv_cache_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(engine.kv_cache_blocks)]
    return [*argv, *engine.extra_args]


def vllm_env(engine: VllmEngine) -> dict[str, str]:
    """This process's environment, offline, with the engine's CPU KV cache space."""
    return {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": str(engine.kv_cache_space_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


async def start_replica(
    name: str, load_source: str, engine: EngineConfig, model: str, workdir: Path
) -> Child:
    """Start one engine that loads its weights from ``load_source`` (the node cache directory or
    the origin) before it is ready; ``model`` is the name it serves."""
    ready_file = workdir / "run" / f"{name}.json"
    ready_file.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(engine, EmulatorEngine):
        argv = emulator_argv(engine, model, load_source, ready_file)
        return await start_child(name, argv, ready_file, workdir / "logs")
    supervisor = module_argv(
        ENGINE_MODULE, "--ready-file", str(ready_file), "--model-dir", load_source, "--"
    )
    argv = [*supervisor, *vllm_argv(engine, model, load_source)]
    return await start_child(name, argv, ready_file, workdir / "logs", vllm_env(engine))


def instance_file(workdir: Path, endpoint: str, variant: str) -> Path:
    """A directory per endpoint: names are DNS labels (no ``/``), so no two pairs share a file,
    as endpoint ``a--b`` variant ``c`` and endpoint ``a`` variant ``b--c`` did in one name."""
    return workdir / "gateway" / endpoint / f"{variant}.json"


def write_instances(path: Path, instances: list[dict[str, str]]) -> bool:
    """Atomically replace the discovery file when its content changes; True if it changed."""
    text = json.dumps({"instances": instances}, sort_keys=True)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True


def start_timed_out(replica: Replica, timeout_s: float) -> bool:
    """Not ready ``engine.startTimeoutS`` after its start (e.g. a stalled weights load), and
    stopped by the fleet's reaper once drained: a stuck replica would otherwise hold its slot
    and block a rollover for ever."""
    if replica.draining_since_s is not None or replica.ready:
        return False
    return time.time() - replica.child.started_wall_s > timeout_s


def drained(replica: Replica, in_flight: Mapping[str, float], grace_s: float) -> bool:
    """Out of the discovery file for ``grace_s`` and no request in flight at the gateway."""
    if replica.draining_since_s is None:
        return False
    if not replica.ready:
        return True
    waited = time.time() - replica.draining_since_s
    return waited >= grace_s and in_flight.get(replica.name, 0.0) <= 0.0


def write_instance_files(
    workdir: Path, endpoints: Iterable[DesiredEndpoint], replicas: Iterable[Replica]
) -> list[tuple[str, str, list[str]]]:
    """Each variant's instance file for the gateway: its ready replicas that are not draining
    nor parked as a warm standby.
    Returns the (endpoint, variant, replica names) whose file changed."""
    ready = sorted(
        (r for r in replicas if r.draining_since_s is None and not r.parked and r.ready and r.url),
        key=lambda r: r.name,
    )
    changed = []
    for endpoint in endpoints:
        for variant in endpoint.spec.variants:
            instances = [
                {"id": r.name, "url": r.url or ""}
                for r in ready
                if r.endpoint == endpoint.name and r.variant == variant.name
            ]
            if write_instances(instance_file(workdir, endpoint.name, variant.name), instances):
                changed.append((endpoint.name, variant.name, [i["id"] for i in instances]))
    return changed
