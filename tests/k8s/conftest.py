"""Session fixtures of the k8s e2e: one real control plane (tests/k8s/controlplane.py) for all
tests, started only when ``WARMFLEET_E2E_K8S=1`` (``make k8s-e2e``), and the results file."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from k8s.controlplane import ControlPlane, from_env
from k8s.k8s_results import ENABLED, LOG_DIR, SKIP_REASON, Results


@pytest.fixture(scope="session")
def results() -> Results:
    if not ENABLED:
        pytest.skip(SKIP_REASON)
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
