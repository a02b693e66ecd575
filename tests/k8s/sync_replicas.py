"""TEST HARNESS: gateway replicas that find each other through their Service's EndpointSlices on
the real control plane (``replicaSync.peers: {type: kubernetes}``).

The replicas run out of cluster on 127.0.0.1, as the warmfleet-gateway service account; their
Service is selector-less, so its EndpointSlices are written here (as the EndpointSlice
controller would for ready pods): one slice per replica, each naming its pod (``targetRef``,
what a replica leaves itself out by: ``$POD_NAME``) and its own sync port (both replicas share
the address)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

from k8s.controlplane import ControlPlane
from k8s.procs import Gateway, serve_gateway
from k8s.serviceaccounts import service_account_kubeconfig
from support.slices import endpoint_slice
from warmfleet.edge import free_port

SERVICE = "gw-sync"
SLICES = "/apis/discovery.k8s.io/v1beta1/namespaces/{ns}/endpointslices"
Obj = dict[str, Any]


def sync_ports() -> int:
    """A free port whose next one is free too (the replica's catch-up socket)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


def create_service(plane: ControlPlane, ns: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": ns},
        "spec": {"ports": [{"name": "sync", "port": 9470, "protocol": "TCP"}]},
    }
    status, answer = plane.request("POST", f"/api/v1/namespaces/{ns}/services", body)
    assert status == 201, answer


def publish(plane: ControlPlane, ns: str, pod: str, port: int) -> str:
    """A ready endpoint of the Service for ``pod`` at 127.0.0.1:``port`` (the replica listens
    as ``tcp://localhost:port``: not the URL listed, so it leaves itself out by its pod name
    alone, as in a pod, where it listens on 0.0.0.0 and is listed at its pod IP); the slice's
    path."""
    name = f"{SERVICE}-{pod}"
    body = endpoint_slice(name, SERVICE, ns, port, {pod: True}, port_name="sync", version="v1beta1")
    path = SLICES.format(ns=ns)
    status, answer = plane.request("POST", path, body)
    assert status == 201, answer
    return f"{path}/{name}"


def start_replica(plane: ControlPlane, ns: str, pod: str, port: int, engines: str) -> Gateway:
    """A gateway replica named ``pod`` (``$POD_NAME``) routing model ``engines`` to the pods of
    the Service ``<engines>-main`` with ``prefix_affinity``, its sync socket on ``port``."""
    kubeconfig = str(service_account_kubeconfig(plane, "warmfleet-gateway"))
    api = {"namespace": ns, "kubeconfig": kubeconfig}
    discovery = {"type": "kubernetes", "service": f"{engines}-main", "port": "http", **api}
    routing = {"strategy": {"type": "prefix_affinity"}}
    variants = [{"name": "main", "discovery": discovery, "routing": routing}]
    sync = {
        "listen": {"host": "localhost", "port": port},  # loopback, named otherwise (publish)
        "peers": {"type": "kubernetes", "service": SERVICE, "port": "sync", **api},
        "catchUpTimeoutS": 5,
    }
    spec = {"endpoints": [{"name": engines, "variants": variants}], "replicaSync": sync}
    return serve_gateway(pod, spec, {"POD_NAME": pod})


def sync_figures(url: str) -> dict[str, float] | None:
    """The replica's ``warmfleet_gateway_replica_sync_*`` series (None: not answering yet)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    prefix = "warmfleet_gateway_replica_sync_"
    return {
        name.removeprefix(prefix): float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line)
        if name.startswith(prefix) and "{" not in name
    }


def turn(url: str, model: str, messages: list[Obj]) -> tuple[str, str, str]:
    """One chat turn: (instance, reason, the reply's text)."""
    body = {"model": model, "messages": messages, "max_tokens": 8}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer = json.loads(resp.read())
        headers = resp.headers
    reply = str(answer["choices"][0]["message"]["content"])
    return headers["x-warmfleet-instance"], headers["x-warmfleet-reason"], reply
