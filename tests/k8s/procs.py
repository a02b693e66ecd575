"""TEST HARNESS: warmfleet processes the k8s e2e starts (operator, gateway, agents, origin),
each stopped by its PID (SIGTERM, then SIGKILL) in the fixture's ``finally``."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from typing import Any

import yaml

from k8s.controlplane import ControlPlane
from k8s.k8s_results import LOG_DIR
from k8s.serviceaccounts import service_account_kubeconfig
from warmfleet.bench.live_procs import free_port

CLI = [sys.executable, "-c", "from warmfleet.cli import main; main()"]
STOP_TIMEOUT_S = 15.0
_STARTS = itertools.count(1)


class Proc:
    """A warmfleet process we started; stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.log_path = LOG_DIR / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, env=None if env is None else {**os.environ, **env},
        )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL by PID: no chance to finish what it was doing."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()


def start_operator(plane: ControlPlane, namespace: str) -> Proc:
    """``warmfleet fleet operator --kubeconfig`` with the warmfleet-operator service account's
    token (deploy/manifests' RBAC), out of cluster."""
    kubeconfig = service_account_kubeconfig(plane, "warmfleet-operator")
    argv = [*CLI, "fleet", "operator", "--namespace", namespace, "--kubeconfig", str(kubeconfig)]
    proc = Proc(f"operator-{namespace}-{next(_STARTS)}", argv)
    time.sleep(1.0)
    if proc.popen.poll() is not None:
        proc.stop()
        raise AssertionError(proc.log_path.read_text()[-2000:])
    return proc


class Gateway(Proc):
    url: str


def start_gateway(plane: ControlPlane, endpoint: str, service: str, namespace: str) -> Gateway:
    """``warmfleet serve`` on 127.0.0.1 with one endpoint whose variant ``main`` follows
    ``service``'s EndpointSlices, out of cluster with the warmfleet-gateway service account."""
    discovery = {
        "type": "kubernetes",
        "service": service,
        "namespace": namespace,
        "port": "http",
        "kubeconfig": str(service_account_kubeconfig(plane, "warmfleet-gateway")),
    }
    variants = [{"name": "main", "discovery": discovery}]
    return serve_gateway(endpoint, {"endpoints": [{"name": endpoint, "variants": variants}]})


def serve_gateway(name: str, spec: dict[str, Any], env: dict[str, str] | None = None) -> Gateway:
    """``warmfleet serve`` of a Gateway document with ``spec`` (listening on a free port of
    127.0.0.1; ``env`` added to the environment)."""
    port = free_port()
    document = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"listen": {"host": "127.0.0.1", "port": port}, **spec},
    }
    config = LOG_DIR / f"gateway-{name}.yaml"
    config.write_text(yaml.safe_dump(document))
    gateway = Gateway(f"gateway-{name}", [*CLI, "serve", "--config", str(config)], env)
    gateway.url = f"http://127.0.0.1:{port}"
    return gateway
