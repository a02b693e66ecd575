"""TEST HARNESS: a kubeconfig for a service account of deploy/manifests, so the operator and the
gateway run out of cluster with exactly the RBAC the manifests give them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from k8s.controlplane import ControlPlane
from k8s.kubelet_stub import wait_for


def service_account_kubeconfig(
    plane: ControlPlane, name: str, namespace: str = "warmfleet-system"
) -> Path:
    """The token of the account's secret (made by the controller-manager's token controller,
    Kubernetes 1.20), with the server and its CA inline, as a kubeconfig file."""
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"

    def secret_name() -> str | None:
        secrets = plane.get_json(path).get("secrets") or []
        return str(secrets[0]["name"]) if secrets else None

    secret = plane.get_json(f"/api/v1/namespaces/{namespace}/secrets/{wait_for(name, secret_name)}")
    token = base64.b64decode(secret["data"]["token"]).decode()
    ca_data = base64.b64encode(plane.ca_path.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {"server": plane.server, "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }
    out = plane.state_dir / f"kubeconfig-{name}"
    out.write_text(json.dumps(config, indent=2))
    return out
