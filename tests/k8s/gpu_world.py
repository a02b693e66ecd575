"""TEST HARNESS: the GPU-node world of tests/k8s/test_k8s_caching.py (its agents' config, its
endpoints, and what the tests read back: agents' reports, engines' weight loads, pods)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import yaml

from k8s.controlplane import ControlPlane
from k8s.endpoints import inference_endpoint
from k8s.procs import CLI, Proc
from warmfleet.api import names

NS = "caching"
POOL = {"e2e.warmfleet.dev/pool": "gpu"}
HOST_PATH = "/opt/warmfleet/cache"
MODEL_BYTES = 48 * 1024 * 1024
API = f"/apis/warmfleet.dev/v1alpha1/namespaces/{NS}"
PREPARED = "warmfleet.dev/prepared"
Obj = dict[str, Any]


def start_agent(root: Path, node: str, kubeconfig: Path) -> Proc:
    cache_root = root / "nodes" / node / HOST_PATH.lstrip("/")
    cache_root.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "NodeCacheConfig",
        "spec": {
            "root": str(cache_root),
            "capacity": {"budget": "1GiB", "highWatermarkFrac": 1.0, "lowWatermarkFrac": 1.0},
            "status": {"host": "127.0.0.1", "port": 0},
            "kubernetes": {
                "hostPath": HOST_PATH,
                "nodeName": node,
                "intervalS": 1.0,
                "kubeconfig": str(kubeconfig),
            },
        },
    }
    path = root / f"agent-{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    return Proc(f"agent-{node}", [*CLI, "cache", "agent", "--config", str(path)])


def endpoint(origin: str, replicas: int) -> Obj:
    python = " ".join(shlex.quote(a) for a in CLI)
    script = (
        'if [ -f "$WARMFLEET_MODEL_DIR/.warmfleet-ready" ]; then SRC="$WARMFLEET_MODEL_DIR"; '
        'else SRC="$WARMFLEET_MODEL_URI"; fi; '
        f'exec {python} emulate --host "$POD_IP" --base-port 8000 --instances 1 '
        '--preset tiny-cpu --model delta --load-weights-from "$SRC"'
    )
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": "delta", "namespace": NS},
        "spec": {
            "modelSource": {
                "uri": f"{origin}/files/model-r1.bin",
                "revision": "r1",
                "sizeBytes": MODEL_BYTES,
            },
            "image": "engine:1",
            "port": 8000,
            "gpusPerReplica": 1,
            "nodeSelector": POOL,
            "command": ["/bin/sh", "-c"],
            "args": [script],
            "modelCacheConfig": {
                "weightsCache": {"enabled": True, "hostPath": HOST_PATH, "gate": {"mode": "all"}}
            },
            "variants": [{"name": "main", "replicas": replicas}],
        },
    }


def reported_ready(plane: ControlPlane) -> set[str]:
    """The nodes whose agent reports a ready cache (Node annotation ``cache-status``)."""
    found = set()
    for node in plane.items("/api/v1/nodes"):
        text = (node["metadata"].get("annotations") or {}).get(names.ANN_CACHE_STATUS)
        reports = json.loads(text) if text else {}
        if any(r.get("state") == "ready" for r in reports.values()):
            found.add(node["metadata"]["name"])
    return found


def ready_for(plane: ControlPlane, cache: str) -> set[str]:
    """The nodes whose agent reports ``cache`` ready."""
    found = set()
    for node in plane.items("/api/v1/nodes"):
        text = (node["metadata"].get("annotations") or {}).get(names.ANN_CACHE_STATUS)
        report = (json.loads(text) if text else {}).get(cache) or {}
        if report.get("state") == "ready":
            found.add(node["metadata"]["name"])
    return found


def weights_load(log_path: Path) -> dict[str, Any] | None:
    """The engine's ready line: where its weights came from and how long they took."""
    try:
        lines = log_path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("{") and '"weights"' in line:
            loaded: dict[str, Any] = json.loads(line)["weights"]
            return loaded
    return None


def running_pods(plane: ControlPlane, count: int) -> list[Obj] | None:
    pods = plane.items(f"/api/v1/namespaces/{NS}/pods")
    ready = [
        p for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True"
               for c in (p.get("status") or {}).get("conditions") or [])
    ]  # fmt: skip
    return ready if len(ready) >= count and len(pods) == count else None


def marked(plane: ControlPlane, count: int) -> list[Obj] | None:
    pods = running_pods(plane, count) or []
    done = [p for p in pods if PREPARED in (p["metadata"].get("annotations") or {})]
    return done if len(done) == count else None


def image_endpoint(name: str) -> Obj:
    """An endpoint with only the image cache: no weights, no command (its pods just run)."""
    return inference_endpoint(
        name,
        NS,
        image="engine:shared",
        nodeSelector=POOL,
        modelCacheConfig={"imageCache": {"enabled": True}},
    )


def image_caches(plane: ControlPlane) -> list[Obj]:
    return [c for c in plane.items(f"{API}/imagecaches") if c["spec"]["image"] == "engine:shared"]


def cache_paths(plane: ControlPlane, cache: str) -> dict[str, str]:
    """node -> the published directory of ``cache`` its agent reports."""
    found = {}
    for node in plane.items("/api/v1/nodes"):
        text = (node["metadata"].get("annotations") or {}).get(names.ANN_CACHE_STATUS)
        report = (json.loads(text) if text else {}).get(cache) or {}
        if report.get("path"):
            found[node["metadata"]["name"]] = str(report["path"])
    return found


def deployments_of(plane: ControlPlane, endpoint_name: str) -> set[str]:
    return {
        d["metadata"]["name"]
        for d in plane.items(f"/apis/apps/v1/namespaces/{NS}/deployments")
        if d["metadata"]["labels"].get(names.LABEL_ENDPOINT) == endpoint_name
    }


def bytes_under(path: str) -> int:
    root = Path(path)
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0
