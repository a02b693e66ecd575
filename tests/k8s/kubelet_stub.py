"""TEST HARNESS: a stand-in kubelet for the k8s e2e (the control plane has no real kubelet).

``register_node`` creates a Ready Node with a loopback InternalIP. ``StubKubelet`` (a thread)
does a kubelet's part for the pods bound to its nodes, as seen through the API server:

- a newly bound pod gets the next loopback address (127.0.1.x by default) as its IP; its first
  container's ``command`` + ``args`` run as a local process (``$(VAR)`` references expanded from the
  container's ``env`` and ``POD_IP``/``POD_NAME``/``NODE_NAME``, as a kubelet expands them); the
  pod is reported Running at once and Ready when the container port accepts connections;
- with ``host_root``, a node's file system is ``host_root/<node>/``: a ``hostPath`` volume
  mounted at ``/m`` is that directory, and env values under ``/m`` are rewritten to it (there
  are no mount namespaces here);
- a pod being deleted (``deletionTimestamp``) has its process stopped (by PID) and is then
  removed with a zero grace period, which is what a kubelet does once its containers are gone.

Every process it started is stopped by PID in ``stop`` (the fixture's ``finally``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from k8s.controlplane import ControlPlane, ControlPlaneError

Obj = dict[str, Any]
WAIT_TIMEOUT_S = 60.0
POLL_S = 0.3
STOP_TIMEOUT_S = 10.0
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def register_node(
    plane: ControlPlane,
    name: str,
    address: str,
    labels: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> Obj:
    """A Ready Node; ``extra``: more capacity (e.g. ``{"nvidia.com/gpu": "1"}``)."""
    stamp = now()
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", **(extra or {})}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
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


def report_pod(plane: ControlPlane, pod: Obj, ip: str, *, ready: bool) -> None:
    """The pod's status as a kubelet writes it (status subresource)."""
    stamp = now()
    meta = pod["metadata"]
    container = pod["spec"]["containers"][0]
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
                for kind in ("Ready", "ContainersReady")
            ]
            + [
                {"type": kind, "status": "True", "lastTransitionTime": stamp}
                for kind in ("Initialized", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": stamp}},
                }
            ],
        }
    }
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
    status, answer = plane.request(
        "PATCH", path, patch, content_type="application/merge-patch+json"
    )
    if status != 200:
        raise ControlPlaneError(f"status of pod {meta['name']}: HTTP {status}: {answer}")


def expand(value: str, env: dict[str, str]) -> str:
    """``$(VAR)`` references as a kubelet expands them (unknown ones stay as written)."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def host_view(value: str, mounts: dict[str, str]) -> str:
    """``value`` with a mount path prefix replaced by the node directory mounted there."""
    for mount_path, directory in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return directory + value[len(mount_path) :]
    return value


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass
class RunningPod:
    name: str
    namespace: str
    node: str
    ip: str
    port: int | None
    popen: subprocess.Popen[bytes] | None
    log_file: IO[bytes] | None
    ready: bool = False
    failed: str | None = None  # the command could not be started (never Ready)
    started_s: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None


class StubKubelet:
    def __init__(
        self,
        plane: ControlPlane,
        nodes: list[str],
        log_dir: Path,
        *,
        ip_prefix: str = "127.0.1.",
        host_root: Path | None = None,
    ) -> None:
        """Pods get ``<ip_prefix>1``, ``2``, ... (one prefix per stub kubelet)."""
        self.plane = plane
        self.ip_prefix = ip_prefix
        self.host_root = host_root
        self.nodes = set(nodes)
        self.log_dir = log_dir
        self.pods: dict[str, RunningPod] = {}  # by uid
        self.finalized: list[str] = []
        self.errors: list[str] = []
        self._next_ip = 1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="stub-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, then every process it started (SIGTERM by PID, SIGKILL if needed)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_TIMEOUT_S)
        for pod in list(self.pods.values()):
            self._stop_process(pod)
        self.pods.clear()

    def lose_node(self, node: str) -> list[str]:
        """The machine is gone: its processes die (SIGKILL) and nothing reports for it any more.
        Returns the pods that were running there."""
        with self._lock:
            self.nodes.discard(node)
            lost = [uid for uid, pod in self.pods.items() if pod.node == node]
            names = []
            for uid in lost:
                pod = self.pods.pop(uid)
                if pod.popen is not None and pod.popen.poll() is None:
                    pod.popen.kill()
                self._stop_process(pod)
                names.append(pod.name)
        return names

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.sync()
            except (ControlPlaneError, OSError, KeyError, ValueError) as err:
                self.errors.append(str(err))
            self._stop.wait(POLL_S)

    def sync(self) -> None:
        status, listing = self.plane.request("GET", "/api/v1/pods")
        if status != 200:
            raise ControlPlaneError(f"list pods: HTTP {status}")
        seen = set()
        for pod in listing["items"]:
            meta, spec = pod["metadata"], pod["spec"]
            if spec.get("nodeName") not in self.nodes:
                continue
            uid = meta["uid"]
            seen.add(uid)
            if meta.get("deletionTimestamp"):
                self._finalize(pod)
            elif uid not in self.pods:
                self._start(pod)
            else:
                self._probe(pod, self.pods[uid])
        for uid in [uid for uid in self.pods if uid not in seen]:  # deleted without us
            self._stop_process(self.pods.pop(uid))

    def _start(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ip = f"{self.ip_prefix}{self._next_ip}"
        self._next_ip += 1
        container = spec["containers"][0]
        ports = container.get("ports") or []
        port = ports[0]["containerPort"] if ports else None
        env = {"POD_IP": ip, "POD_NAME": meta["name"], "NODE_NAME": spec["nodeName"]}
        mounts = self._host_mounts(spec, container)
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = host_view(expand(item["value"], env), mounts)
        argv = [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
        popen, log_file, failed = None, None, None
        if argv:
            log_file = (self.log_dir / f"pod-{meta['name']}.log").open("wb")
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                    start_new_session=True,  # Ctrl-C reaches pytest only; stop() ends it by PID
                )
            except OSError as err:  # e.g. a binary only the image has: never Ready
                failed = str(err)
        running = RunningPod(
            meta["name"], meta["namespace"], spec["nodeName"], ip, port, popen, log_file
        )
        running.failed = failed
        self.pods[meta["uid"]] = running
        report_pod(self.plane, pod, ip, ready=False)

    def _host_mounts(self, spec: Obj, container: Obj) -> dict[str, str]:
        """mountPath -> the node's directory, for the container's hostPath volumes."""
        if self.host_root is None:
            return {}
        host = {
            v["name"]: v["hostPath"]["path"] for v in spec.get("volumes") or [] if "hostPath" in v
        }
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in host:
                directory = self.host_root / spec["nodeName"] / host[mount["name"]].lstrip("/")
                directory.mkdir(parents=True, exist_ok=True)  # the volume's DirectoryOrCreate
                mounts[mount["mountPath"].rstrip("/")] = str(directory)
        return mounts

    def _probe(self, pod: Obj, running: RunningPod) -> None:
        if running.ready or running.failed:
            return
        alive = running.popen is None or running.popen.poll() is None
        if alive and (running.port is None or port_open(running.ip, running.port)):
            running.ready = True
            running.ready_after_s = time.monotonic() - running.started_s
            report_pod(self.plane, pod, running.ip, ready=True)

    def _finalize(self, pod: Obj) -> None:
        meta = pod["metadata"]
        running = self.pods.pop(meta["uid"], None)
        if running is not None:
            self._stop_process(running)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]}}  # fmt: skip
        status, answer = self.plane.request("DELETE", path, body)
        if status not in (200, 404, 409):
            raise ControlPlaneError(f"delete pod {meta['name']}: HTTP {status}: {answer}")
        self.finalized.append(meta["name"])

    @staticmethod
    def _stop_process(running: RunningPod) -> None:
        popen = running.popen
        if popen is not None and popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=STOP_TIMEOUT_S)
        if running.log_file is not None:
            with contextlib.suppress(OSError):
                running.log_file.close()


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
