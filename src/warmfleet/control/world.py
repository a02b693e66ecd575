"""An in-memory fleet that executes reconciler actions (pure): the state store of a backend that
has no API server (the embedded local fleet, tests, simulations).

``World`` holds the desired endpoints and everything the reconciler observes. ``apply`` executes
actions exactly as a backend must (idempotently); the methods below it stand in for the parts a
real backend gets from outside: node agents filling caches (``agents_step``), a scheduler
placing replicas (``schedule``) and replicas becoming ready (``mark_ready``). A real backend
replaces these with its own observations and keeps ``apply`` semantics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from warmfleet.control.actions import (
    Action,
    ApplyDeployment,
    ApplyImageCache,
    ApplyImagePuller,
    ApplyModelCache,
    AssignNodeCaches,
    DeleteDeployment,
    DeleteImageCache,
    DeleteImagePuller,
    DeleteModelCache,
    ReleaseEndpoint,
    ScaleDeployment,
    SetNodeLabels,
    UpdateEndpointStatus,
    UpdateImageCacheStatus,
    UpdateModelCacheStatus,
)
from warmfleet.control.observed import (
    DesiredEndpoint,
    NodeCacheReport,
    NodeCacheState,
    ObservedDeployment,
    ObservedImageCache,
    ObservedModelCache,
    ObservedNode,
    ObservedReplica,
    ObservedState,
)
from warmfleet.control.placement import choose_nodes

# decides one node's fill of one cache: (node, cache) -> report
FillOutcome = Callable[[str, str], NodeCacheReport]


def _ready(_node: str, _cache: str) -> NodeCacheReport:
    return NodeCacheReport(NodeCacheState.READY, 1, 1)


class World:
    def __init__(self, nodes: Iterable[ObservedNode] = ()) -> None:
        self.endpoints: dict[str, DesiredEndpoint] = {}
        self.nodes: dict[str, ObservedNode] = {n.name: n for n in nodes}
        self.model_caches: dict[str, ObservedModelCache] = {}
        self.image_caches: dict[str, ObservedImageCache] = {}
        self.deployments: dict[str, ObservedDeployment] = {}
        self.plans: dict[str, ApplyDeployment] = {}
        self.released: list[str] = []
        self._pod_counter = 0

    # ---------------------------------------------------------------- user-facing changes

    def put_endpoint(self, endpoint: DesiredEndpoint) -> None:
        old = self.endpoints.get(endpoint.name)
        self.endpoints[endpoint.name] = replace(endpoint, status=old.status if old else None)

    def delete_endpoint(self, name: str) -> None:
        self.endpoints[name] = replace(self.endpoints[name], deleting=True)

    def desired(self) -> list[DesiredEndpoint]:
        return list(self.endpoints.values())

    def observed(self, now_s: float) -> ObservedState:
        return ObservedState(
            now_s=now_s,
            nodes=tuple(self.nodes[n] for n in sorted(self.nodes)),
            model_caches=tuple(self.model_caches[n] for n in sorted(self.model_caches)),
            image_caches=tuple(self.image_caches[n] for n in sorted(self.image_caches)),
            deployments=tuple(self.deployments[n] for n in sorted(self.deployments)),
        )

    # ---------------------------------------------------------------- executing actions

    def apply(self, actions: Sequence[Action], now_s: float) -> None:
        for action in actions:
            self._apply_one(action, now_s)

    def _apply_one(self, action: Action, now_s: float) -> None:
        if isinstance(action, ApplyModelCache):
            old = self.model_caches.get(action.name)
            created = old.created_s if old else now_s
            status = old.status if old else None
            self.model_caches[action.name] = ObservedModelCache(
                action.name, action.spec, created, status
            )
        elif isinstance(action, DeleteModelCache):
            self.model_caches.pop(action.name, None)
        elif isinstance(action, ApplyImageCache):
            old_image = self.image_caches.get(action.name)
            self.image_caches[action.name] = ObservedImageCache(
                action.name,
                action.spec,
                old_image.created_s if old_image else now_s,
                old_image.status if old_image else None,
                old_image.puller if old_image else False,
            )
        elif isinstance(action, DeleteImageCache):
            self.image_caches.pop(action.name, None)
        elif isinstance(action, ApplyImagePuller | DeleteImagePuller):
            image = self.image_caches.get(action.cache)
            if image is not None:
                puller = isinstance(action, ApplyImagePuller)
                self.image_caches[action.cache] = replace(image, puller=puller)
        elif isinstance(action, AssignNodeCaches):
            node = self.nodes.get(action.node)
            if node is not None:
                told = frozenset(a.key() for a in action.caches)
                self.nodes[node.name] = replace(node, told=told)
        elif isinstance(action, SetNodeLabels):
            self._set_labels(action)
        elif isinstance(action, ApplyDeployment):
            self._apply_deployment(action)
        elif isinstance(action, ScaleDeployment):
            dep = self.deployments.get(action.name)
            if dep is not None:
                self.deployments[action.name] = replace(dep, replicas=action.replicas)
        elif isinstance(action, DeleteDeployment):
            self.deployments.pop(action.name, None)
            self.plans.pop(action.name, None)
        else:
            self._apply_status(action)

    def _apply_status(self, action: Action) -> None:
        if isinstance(action, UpdateEndpointStatus) and action.name in self.endpoints:
            self.endpoints[action.name] = replace(self.endpoints[action.name], status=action.status)
        elif isinstance(action, UpdateModelCacheStatus) and action.name in self.model_caches:
            self.model_caches[action.name] = replace(
                self.model_caches[action.name], status=action.status
            )
        elif isinstance(action, UpdateImageCacheStatus) and action.name in self.image_caches:
            self.image_caches[action.name] = replace(
                self.image_caches[action.name], status=action.status
            )
        elif isinstance(action, ReleaseEndpoint) and action.name in self.endpoints:
            del self.endpoints[action.name]
            self.released.append(action.name)

    def _set_labels(self, action: SetNodeLabels) -> None:
        node = self.nodes.get(action.node)
        if node is None:
            return
        labels = {k: v for k, v in node.labels.items() if k not in action.remove}
        labels.update(action.set_labels)
        self.nodes[node.name] = replace(node, labels=labels)

    def _apply_deployment(self, action: ApplyDeployment) -> None:
        p = action.plan
        old = self.deployments.get(p.name)
        pods = old.pods if old is not None and old.spec_hash == p.spec_hash() else ()
        self.deployments[p.name] = ObservedDeployment(
            name=p.name,
            endpoint=p.endpoint,
            variant=p.variant,
            revision=p.revision,
            replicas=p.replicas,
            model_cache=p.model_cache,
            image_cache=p.image_cache,
            spec_hash=p.spec_hash(),
            pods=pods,
            update_bounds=p.update_bounds,
        )
        self.plans[p.name] = action

    # ---------------------------------------------------------------- the outside world

    def agents_step(self, fill: FillOutcome = _ready) -> None:
        """Every ready node fills its assigned caches, evicts the others, pulls its images."""
        for name, node in list(self.nodes.items()):
            if not node.ready:
                continue
            weights = {c: r for c, r in node.weights.items() if c in node.assigned}
            for cache in node.assigned:
                if cache not in weights:
                    weights[cache] = fill(name, cache)
            images = {c: r for c, r in node.images.items() if c in self._pulled_on(node)}
            for cache in self._pulled_on(node):
                if cache not in images:
                    images[cache] = fill(name, cache)
            self.nodes[name] = replace(node, weights=weights, images=images)

    def _pulled_on(self, node: ObservedNode) -> set[str]:
        return {
            c.name
            for c in self.image_caches.values()
            if c.puller and node.matches(c.spec.node_selector)
        }

    def schedule(self, now_s: float) -> None:
        """Create or remove replicas to match each Deployment (placement: warm nodes first)."""
        for name in sorted(self.deployments):
            dep = self.deployments[name]
            pods = [p for p in dep.pods if self._node_ready(p.node)]
            plan = self.plans[name].plan
            if len(pods) > dep.replicas:  # as a ReplicaSet: replicas not ready go first
                pods.sort(key=lambda p: not p.ready)
                pods = pods[: dep.replicas]
            missing = dep.replicas - len(pods)
            if missing > 0:
                load = self._replicas_per_node()
                for placement in choose_nodes(
                    missing,
                    list(self.nodes.values()),
                    plan.preferences,
                    load,
                    node_selector=plan.node_selector,
                    max_per_node=1_000_000,
                ):
                    self._pod_counter += 1
                    pods.append(
                        ObservedReplica(
                            f"{name}-{self._pod_counter}",
                            placement.node,
                            now_s,
                            None,
                            placement.prepared,
                        )
                    )
            self.deployments[name] = replace(dep, pods=tuple(pods))

    def mark_ready(self, now_s: float) -> None:
        for name, dep in list(self.deployments.items()):
            pods = tuple(p if p.ready else replace(p, ready_s=now_s) for p in dep.pods)
            self.deployments[name] = replace(dep, pods=pods)

    def _node_ready(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and node.ready

    def _replicas_per_node(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for dep in self.deployments.values():
            for pod in dep.pods:
                load[pod.node] = load.get(pod.node, 0) + 1
        return load
