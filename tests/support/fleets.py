"""The smallest ``warmfleet up`` fleet (one node, one 1 MB model, one replica) and a process
liveness check, for the tests that run ``warmfleet up`` as a real process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def small_fleet(workdir: Path, gateway_port: int = 0) -> dict[str, Any]:
    """A ``LocalFleet`` document in ``workdir``, its gateway on ``gateway_port`` (0: any)."""
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "LocalFleet",
        "spec": {
            "workdir": str(workdir),
            "nodes": [{"name": "n1", "budget": "64MiB"}],
            "origin": {
                "throttle": None,
                "models": [{"name": "m", "size": 1_000_000, "revisions": ["v1"]}],
            },
            "gateway": {"port": gateway_port},
            "reconcileIntervalS": 0.2,
            "endpoints": [
                {
                    "name": "m",
                    "spec": {
                        "modelSource": {"uri": "origin://m", "revision": "v1"},
                        "image": "x",
                        "modelCacheConfig": {"weightsCache": {"enabled": True}},
                        "variants": [{"name": "main", "replicas": 1}],
                    },
                }
            ],
        },
    }


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
