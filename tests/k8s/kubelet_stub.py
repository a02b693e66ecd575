"""TEST HARNESS: the kubelet's API writes, done by hand for the k8s e2e (there is no kubelet).

``register_node`` creates a Ready Node with a loopback InternalIP (127.0.0.x); ``report_pod``
writes a pod's status as a kubelet would once its container runs (phase, pod IP, Ready), through
the status subresource. Processes are not run here: a test that needs one starts it itself and
stops it by PID.
"""

from __future__ import annotations

import time
from typing import Any

from k8s.controlplane import ControlPlane, ControlPlaneError

Obj = dict[str, Any]
WAIT_TIMEOUT_S = 60.0


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def register_node(
    plane: ControlPlane, name: str, address: str, labels: dict[str, str] | None = None
) -> Obj:
    stamp = now()
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
            ],
        },
    }
    status, answer = plane.request("POST", "/api/v1/nodes", body)
    if status != 201:
        raise ControlPlaneError(f"create node {name}: HTTP {status}: {answer}")
    node: Obj = answer
    return node


def report_pod(plane: ControlPlane, namespace: str, name: str, ip: str, *, ready: bool) -> Obj:
    stamp = now()
    condition = "True" if ready else "False"
    patch = {
        "status": {
            "phase": "Running",
            "hostIP": ip,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": stamp,
            "conditions": [
                {"type": kind, "status": condition, "lastTransitionTime": stamp}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
        }
    }
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/status"
    status, answer = plane.request("PATCH", path, patch)
    if status != 200:
        raise ControlPlaneError(f"status of pod {namespace}/{name}: HTTP {status}: {answer}")
    pod: Obj = answer
    return pod


def wait_for(what: str, probe: Any, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """Poll ``probe()`` until it returns something truthy (returned); bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)
