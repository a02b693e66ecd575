"""InferenceEndpoint documents for the real-server scenarios: one builder, each scenario names
what its endpoint changes."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def inference_endpoint(name: str, namespace: str, *, replicas: int = 1, **spec: Any) -> Obj:
    """``name`` in ``namespace``: weights from ``s3://models/<name>/`` r1, image ``engine:1``
    and one variant ``main`` of ``replicas``, with ``spec``'s fields set over those."""
    base: Obj = {
        "modelSource": {"uri": f"s3://models/{name}/", "revision": "r1"},
        "image": "engine:1",
    }
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "InferenceEndpoint",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**base, **spec, "variants": [{"name": "main", "replicas": replicas}]},
    }


def emulator_args(model: str, port: int) -> list[str]:
    """The pod args that run one emulated engine serving ``model`` on its pod IP (``$(POD_IP)``,
    expanded by the kubelet)."""
    return ["emulate", "--host", "$(POD_IP)", "--base-port", str(port), "--instances", "1",
            "--preset", "tiny-cpu", "--model", model]  # fmt: skip
