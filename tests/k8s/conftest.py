"""Session fixtures of the k8s e2e: one real control plane (tests/k8s/controlplane.py) for all
tests, started only when ``WARMFLEET_E2E_K8S=1`` (``make k8s-e2e``), and the results file."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from k8s.controlplane import ControlPlane, from_env
from k8s.k8s_results import DEPLOY, ENABLED, LOG_DIR, SKIP_REASON, Results, documents

ESTABLISH_TIMEOUT_S = 60.0
RBAC_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ConfigMap",
}
Obj = dict[str, Any]


@pytest.fixture(scope="session")
def results() -> Results:
    if not ENABLED:
        pytest.skip(SKIP_REASON)
    shutil.rmtree(LOG_DIR, ignore_errors=True)  # this run's logs only
    LOG_DIR.mkdir(parents=True)
    return Results()


@pytest.fixture(scope="session")
def control_plane(results: Results) -> Iterator[ControlPlane]:
    plane = from_env(LOG_DIR)
    try:
        plane.start()
        version = plane.get_json("/version")
        results.record(
            server_version=version["gitVersion"], control_plane_start_s=round(plane.started_s, 1)
        )
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane, results: Results) -> int:
    """deploy/crds applied; the number that became Established (waited for, bounded)."""
    control_plane.kubectl("apply", "-f", str(DEPLOY / "crds"))
    names = [
        doc["metadata"]["name"] for f in sorted(DEPLOY.glob("crds/*.yaml")) for doc in documents(f)
    ]
    deadline = time.monotonic() + ESTABLISH_TIMEOUT_S
    established: set[str] = set()
    while time.monotonic() < deadline and len(established) < len(names):
        for name in names:
            crd = control_plane.get_json(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conditions = crd.get("status", {}).get("conditions", [])
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                established.add(name)
        time.sleep(0.2)
    results.record(crds_established=len(established))
    return len(established)


@pytest.fixture(scope="session")
def rbac(control_plane: ControlPlane, results: Results) -> list[Obj]:
    """The namespace, service accounts, roles, bindings and config maps of deploy/manifests
    created for real, then the whole file applied as a server-side dry run (the workloads are
    not created: the DaemonSet and Deployments would need images this test kubelet lacks)."""
    manifests = DEPLOY / "manifests" / "warmfleet.yaml"
    real = [doc for doc in documents(manifests) if doc["kind"] in RBAC_KINDS]
    control_plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(real))
    control_plane.kubectl("apply", "--dry-run=server", "-f", str(manifests))  # the workloads too
    results.record(rbac_objects_applied=len(real), manifests_dry_run_ok=True)
    return real
