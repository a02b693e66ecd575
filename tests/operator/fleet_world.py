"""A converged in-memory fleet (for validating rendered objects and statuses)."""

from __future__ import annotations

from warmfleet.api.resources import InferenceEndpoint
from warmfleet.control.observed import DesiredEndpoint, ObservedNode
from warmfleet.control.reconciler import plan
from warmfleet.control.world import World

EXAMPLE = {
    "metadata": {"name": "llama"},
    "spec": {
        "modelSource": {"uri": "s3://models/llama", "revision": "v1"},
        "image": "vllm/vllm-openai:v0.9",
        "gpusPerReplica": 8,
        "command": ["/bin/sh", "-c"],
        "args": ["exec vllm serve $WARMFLEET_MODEL_URI"],
        "nodeSelector": {"pool": "gpu"},
        "modelCacheConfig": {"weightsCache": {"enabled": True}, "imageCache": {"enabled": True}},
        "variants": [{"name": "main", "replicas": 2}, {"name": "canary", "replicas": 1}],
    },
}


def endpoint_world() -> tuple[World, DesiredEndpoint]:
    doc = InferenceEndpoint.model_validate(EXAMPLE)
    endpoint = DesiredEndpoint(name=doc.metadata.name, spec=doc.spec, uid="uid-1")
    world = World([ObservedNode(f"n{i}", labels={"pool": "gpu"}) for i in range(3)])
    world.put_endpoint(endpoint)
    for step in range(10):
        actions = plan(world.desired(), world.observed(float(step)))
        if not actions:
            break
        world.apply(actions, float(step))
        world.agents_step()
        world.schedule(float(step))
        world.mark_ready(step + 0.5)
    return world, endpoint
