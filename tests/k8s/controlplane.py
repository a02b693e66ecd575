"""TEST HARNESS: a real Kubernetes control plane on 127.0.0.1 for the k8s e2e tests.

etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager and kube-scheduler (v1.20.2,
built by scripts/k8s/build.sh into the per-machine cache), each on a random free port of
127.0.0.1, state in a temp dir, a static admin token with RBAC on, service-account signing keys
made with openssl, and a kubeconfig written for clients (kubectl, the operator). There is no
kubelet and no kube-proxy: Service ClusterIPs are numbers only.

Every process is started in its own session (a terminal's Ctrl-C reaches only pytest) and stopped
by its PID in ``ControlPlane.stop`` (idempotent), which runs from the fixture's ``finally`` and from
``atexit``. Logs go to ``log_dir`` (bench-results/k8s-e2e-logs) and stay after the run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import IO, Any

from warmfleet.bench.live_procs import free_port

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 5.0
KUBECTL_TIMEOUT_S = 60.0
LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc"


class ControlPlaneError(RuntimeError):
    """A component did not start (the message names its log file)."""


def find_binary(name: str, bin_dir: Path) -> Path:
    """``bin_dir/name``, else ``name`` on ``$PATH`` (etcd comes from Debian's etcd-server)."""
    candidate = bin_dir / name
    if candidate.is_file():
        return candidate
    found = shutil.which(name)
    if found is None:
        raise ControlPlaneError(f"{name} not found in {bin_dir} nor on PATH")
    return Path(found)


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


@dataclass
class ControlPlane:
    bin_dir: Path
    log_dir: Path
    state_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="wf-k8s-")))
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    processes: list[Process] = field(default_factory=list)
    api_port: int = 0
    etcd_port: int = 0
    started_s: float = 0.0

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.api_port}"

    @property
    def ca_path(self) -> Path:
        """The API server's self-signed serving certificate (leaf + its CA), written by the
        API server into its --cert-dir; clients trust it as their CA bundle."""
        return self.state_dir / "apiserver-certs" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start every component and wait until the API server is ready; on any failure every
        process started so far is stopped before the error propagates."""
        atexit.register(self.stop)
        t0 = time.monotonic()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._make_keys()
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready()
            self._write_kubeconfig()
            self._start_controller_manager()
            self._start_scheduler()
            self._wait_for_default_service_account()
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - t0

    def stop(self) -> None:
        """SIGTERM each process we started (newest first) by PID, SIGKILL after a grace period;
        then remove the state dir. Idempotent."""
        for proc in reversed(self.processes):
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in reversed(self.processes):
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=STOP_TIMEOUT_S)
            proc.log_file.close()
        self.processes.clear()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        for proc in self.processes:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with {proc.popen.returncode}; see {proc.log_path}"
                )

    # ---- clients -----------------------------------------------------------------------------

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(find_binary("kubectl", self.bin_dir)), "--kubeconfig", str(self.kubeconfig)]
        result = subprocess.run(
            [*argv, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def get_json(self, path: str) -> Any:
        """GET ``path`` on the API server as the admin; ``HTTPError`` unless 2xx."""
        status, body = self.request("GET", path)
        if status >= 300:
            raise urllib.error.HTTPError(self.server + path, status, str(body), Message(), None)
        return body

    def items(self, path: str) -> list[dict[str, Any]]:
        """The ``items`` of a list at ``path``."""
        return list(self.get_json(path)["items"])

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """One call as the admin (stdlib client, bounded by a timeout): (status, JSON body).
        PATCH bodies are JSON merge patches unless ``content_type`` says otherwise."""
        data = None if body is None else json.dumps(body).encode()
        if method == "PATCH" and content_type == "application/json":
            content_type = "application/merge-patch+json"
        request = urllib.request.Request(
            self.server + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        context = ssl.create_default_context(cafile=str(self.ca_path))
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=context) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            with err:
                return err.code, json.loads(err.read() or b"null")

    # ---- components --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> Process:
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("wb")
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.state_dir,
            start_new_session=True,  # Ctrl-C reaches pytest only; stop() ends us by PID
        )
        proc = Process(name, popen, log_path, log_file)
        self.processes.append(proc)
        with (self.state_dir / "pids").open("a") as pids:
            pids.write(f"{name} {popen.pid}\n")
        return proc

    def _make_keys(self) -> None:
        keys = self.state_dir / "keys"
        keys.mkdir()
        openssl = ["openssl"]
        sa_key, sa_pub = keys / "sa.key", keys / "sa.pub"
        for argv in (
            [*openssl, "genrsa", "-out", str(sa_key), "2048"],
            [*openssl, "rsa", "-in", str(sa_key), "-pubout", "-out", str(sa_pub)],
        ):
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        (keys / "tokens.csv").write_text(f"{self.token},admin,admin-uid,system:masters\n")

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        peer_url = f"http://{LOOPBACK}:{peer}"
        client_url = f"http://{LOOPBACK}:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(find_binary("etcd", self.bin_dir)),
                "--name=wf",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=wf={peer_url}",
                f"--listen-metrics-urls=http://{LOOPBACK}:{free_port()}",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self) -> None:
        self.api_port = free_port()
        keys = self.state_dir / "keys"
        self._spawn(
            "kube-apiserver",
            [
                str(find_binary("kube-apiserver", self.bin_dir)),
                f"--etcd-servers=http://{LOOPBACK}:{self.etcd_port}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.api_port}",
                "--insecure-port=0",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                f"--token-auth-file={keys / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={keys / 'sa.pub'}",
                f"--service-account-signing-key-file={keys / 'sa.key'}",
                f"--api-audiences={ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--endpoint-reconciler-type=none",
                "--v=1",
            ],
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            self.check_alive()
            if self.ca_path.exists():
                try:
                    request = urllib.request.Request(
                        self.server + "/readyz", headers={"Authorization": f"Bearer {self.token}"}
                    )
                    context = ssl.create_default_context(cafile=str(self.ca_path))
                    with urllib.request.urlopen(
                        request, timeout=HTTP_TIMEOUT_S, context=context
                    ) as resp:
                        if resp.status == 200:
                            return
                except (OSError, urllib.error.URLError, ssl.SSLError) as err:
                    last = str(err)
            time.sleep(0.2)
        raise ControlPlaneError(f"kube-apiserver not ready in {START_TIMEOUT_S:.0f} s: {last}")

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "warmfleet-e2e",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [
                {"name": "admin", "context": {"cluster": "warmfleet-e2e", "user": "admin"}}
            ],
            "current-context": "admin",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is YAML

    def _start_controller_manager(self) -> None:
        keys = self.state_dir / "keys"
        self._spawn(
            "kube-controller-manager",
            [
                str(find_binary("kube-controller-manager", self.bin_dir)),
                f"--kubeconfig={self.kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={free_port()}",
                "--port=0",
                f"--cert-dir={self.state_dir / 'kcm-certs'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={keys / 'sa.key'}",
                f"--root-ca-file={self.ca_path}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # no kubelet heartbeats here: registered Nodes stay Ready for the whole run
                "--node-monitor-grace-period=30m",
                "--node-startup-grace-period=30m",
                "--v=1",
            ],
        )

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                str(find_binary("kube-scheduler", self.bin_dir)),
                f"--kubeconfig={self.kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={free_port()}",
                "--port=0",
                f"--cert-dir={self.state_dir / 'scheduler-certs'}",
                "--leader-elect=false",
                "--v=1",
            ],
        )

    def _wait_for_default_service_account(self) -> None:
        """The controller-manager is working once it created the default ServiceAccount."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                self.get_json("/api/v1/namespaces/default/serviceaccounts/default")
                return
            except urllib.error.HTTPError as err:
                if err.code != 404:
                    raise
            time.sleep(0.3)
        raise ControlPlaneError("kube-controller-manager made no default ServiceAccount in time")


def from_env(log_dir: Path) -> ControlPlane:
    """The control plane of ``$WARMFLEET_K8S_BIN`` (set by ``make k8s-e2e``), not yet started."""
    bin_dir = os.environ.get("WARMFLEET_K8S_BIN", "")
    if not bin_dir or not (Path(bin_dir) / "kube-apiserver").is_file():
        raise ControlPlaneError(
            f"WARMFLEET_K8S_BIN={bin_dir!r} holds no kube-apiserver: run `make k8s-e2e` "
            "(it builds or reuses the binaries via scripts/k8s/build.sh)"
        )
    return ControlPlane(bin_dir=Path(bin_dir), log_dir=log_dir)
