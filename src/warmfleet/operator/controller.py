"""One reconciliation pass against the Kubernetes API: read, plan (pure), execute the actions."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from warmfleet.api import names
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
from warmfleet.control.autoscaler import AutoscalerState
from warmfleet.control.claims import (
    IMAGE_CACHE,
    MODEL_CACHE,
    Conflicts,
    blocked,
    name_conflicts,
)
from warmfleet.control.load import VariantKey, autoscale, in_flight_by_variant
from warmfleet.control.observed import DesiredEndpoint, ObservedState
from warmfleet.control.reconciler import plan
from warmfleet.kube import client as kube
from warmfleet.operator import ownership, render
from warmfleet.operator.observe import ANN_AUTOSCALED, Snapshot, desired_endpoints, observed_state

log = logging.getLogger(__name__)
Obj = dict[str, Any]
_CACHE_ACTIONS = (
    ApplyModelCache,
    ApplyImageCache,
    DeleteModelCache,
    DeleteImageCache,
    ApplyImagePuller,
    DeleteImagePuller,
)
_WorkloadAction = ApplyDeployment | ScaleDeployment | DeleteDeployment | ReleaseEndpoint
_WORKLOAD_ACTIONS = (ApplyDeployment, ScaleDeployment, DeleteDeployment, ReleaseEndpoint)


@dataclass
class PassResult:
    actions: list[Action] = field(default_factory=list)
    released: set[str] = field(default_factory=set)


class Controller:
    """Level-triggered: every pass re-reads everything; passes are serialised by a lock."""

    def __init__(
        self,
        client: kube.KubeClient,
        namespace: str,
        clock: Callable[[], float],
        *,
        metrics: Callable[[], Awaitable[list[str | None]]] | None = None,
    ) -> None:
        """``metrics`` returns the gateways' Prometheus texts (None: no autoscaling)."""
        self._client = client
        self._ns = namespace
        self._clock = clock
        self._metrics = metrics
        self._scale_states: dict[VariantKey, AutoscalerState] = {}
        self._conflicts: Conflicts = {}  # this pass's (control.claims)
        self._read: dict[tuple[str, str], Obj] = {}  # this pass's objects, (plural, name)
        self._lock = asyncio.Lock()

    async def snapshot(self) -> Snapshot:
        c, ns = self._client, self._ns
        return Snapshot(
            endpoints=await c.list(kube.ENDPOINTS, ns),
            nodes=await c.list(kube.NODES, None),
            model_caches=await c.list(kube.MODEL_CACHES, ns),
            image_caches=await c.list(kube.IMAGE_CACHES, ns),
            deployments=await c.list(kube.DEPLOYMENTS, ns),
            daemonsets=await c.list(kube.DAEMONSETS, ns),  # a user's of a puller's name too
            pods=await c.list(kube.PODS, ns),
            services=await c.list(kube.SERVICES, ns),
        )

    async def reconcile(self) -> PassResult:
        async with self._lock:
            snap = await self.snapshot()
            self._read = _read_index(snap)
            now_s = self._clock()
            desired = desired_endpoints(snap)
            observed = observed_state(snap, now_s)
            desired = await self._autoscale(desired, observed, now_s)
            await self._mark_prepared(snap, observed)
            self._conflicts = name_conflicts(desired, observed)  # the plan's, and the Services'
            actions = plan(desired, observed, self._conflicts)
            result = PassResult(actions=actions)
            uids = {e.name: e for e in desired}
            ownership.report_conflicts(actions, uids)
            for action in actions:
                await self._execute(action, uids, now_s, result)
            await self._sync_services(desired, snap.deployments)
            return result

    async def _sync_services(self, desired: list[DesiredEndpoint], deployments: list[Obj]) -> None:
        """A live endpoint's Service and its deployed variants' exist: they are applied with
        the Deployment, and a pass cut short between the two (an operator killed or restarted)
        leaves the rest to this check. The Service of a variant removed from a live endpoint
        goes (the endpoint's own Service, and those of endpoints being released, are the plan's
        business)."""
        live = {e.name: e for e in desired if not e.deleting}
        variants = {name: {v.name for v in e.spec.variants} for name, e in live.items()}
        services = await self._client.list(kube.SERVICES, self._ns)  # a name anyone holds
        have = {(s.get("metadata") or {}).get("name") for s in services}
        for endpoint, variant in sorted(_deployed_variants(deployments)):
            wanted = live.get(endpoint)
            if wanted is None or variant not in variants[endpoint]:
                continue
            for part in (None, variant):
                if names.service_name(endpoint, part) not in have:
                    await self._apply_service(wanted, wanted.spec.port, part)
                    have.add(names.service_name(endpoint, part))
        for service in services:
            meta = service.get("metadata") or {}
            labels = meta.get("labels") or {}
            owner = live.get(str(labels.get(names.LABEL_ENDPOINT)))
            part = labels.get(names.LABEL_VARIANT)
            if owner is None or part is None or part in variants[owner.name]:
                continue
            if ownership.owned(names.SERVICE, service, owner):  # not another's of that name
                await ownership.delete_as_read(self._client, kube.SERVICES, self._ns, service)

    async def _apply_service(
        self, endpoint: DesiredEndpoint, port: int, variant: str | None
    ) -> None:
        """The endpoint's Service (``variant`` None) or a variant's, unless another holds it."""
        name = names.service_name(endpoint.name, variant)
        if name in blocked(self._conflicts.get(endpoint.name, ()), names.SERVICE):
            return  # in its status already
        body = render.service(endpoint.name, port, self._ns, endpoint.uid, variant)
        await ownership.apply_owned(self._client, kube.SERVICES, names.SERVICE, body, endpoint)

    async def _autoscale(
        self, desired: list[DesiredEndpoint], observed: ObservedState, now_s: float
    ) -> list[DesiredEndpoint]:
        """Scale autoscaled variants on the gateways' in-flight gauge; the decision is kept in an
        endpoint annotation so it survives operator restarts."""
        if self._metrics is None:
            return desired
        scraped = await self._metrics()  # None: a gateway that could not be scraped
        texts = [text for text in scraped if text is not None]
        in_flight = in_flight_by_variant(texts)
        decisions, self._scale_states = autoscale(
            desired,
            observed.deployments,
            in_flight,
            now_s,
            self._scale_states,
            partial=len(texts) < len(scraped),
        )
        result = []
        for endpoint in desired:
            decided = decisions.get(endpoint.name)
            if decided is not None and decided != dict(endpoint.autoscaled_replicas):
                value = json.dumps(decided, sort_keys=True)
                patch = {"metadata": {"annotations": {ANN_AUTOSCALED: value}}}
                await self._client.patch(kube.ENDPOINTS, self._ns, endpoint.name, patch)
                endpoint = replace(endpoint, autoscaled_replicas=decided)
            result.append(endpoint)
        return result

    async def _mark_prepared(self, snap: Snapshot, observed: ObservedState) -> None:
        """Record once, when a replica is first seen on a node, whether that node was warm."""
        labels = {n.name: n.labels for n in observed.nodes}
        caches = {d.name: d.model_cache for d in observed.deployments}
        for pod in snap.pods:
            meta = pod.get("metadata") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            pod_labels = meta.get("labels") or {}
            if not node or render.ANN_PREPARED in (meta.get("annotations") or {}):
                continue
            key = names.LABEL_ENDPOINT, names.LABEL_VARIANT, names.LABEL_REVISION
            if not all(k in pod_labels for k in key):
                continue
            dep = names.deployment_name(*(pod_labels[k] for k in key))
            cache = caches.get(dep)
            warm = cache is None or labels.get(node, {}).get(names.weights_label(cache)) == "ready"
            patch = {
                "metadata": {"annotations": {render.ANN_PREPARED: "true" if warm else "false"}}
            }
            await self._client.patch(kube.PODS, self._ns, meta["name"], patch)

    async def _execute(
        self,
        action: Action,
        endpoints: dict[str, DesiredEndpoint],
        now_s: float,
        result: PassResult,
    ) -> None:
        if isinstance(action, _CACHE_ACTIONS):
            await self._cache_action(action, endpoints, now_s)
        elif isinstance(action, AssignNodeCaches | SetNodeLabels):
            await self._node_action(action)
        elif isinstance(
            action, ApplyDeployment | ScaleDeployment | DeleteDeployment | ReleaseEndpoint
        ):
            await self._workload_action(action, endpoints, result)
        else:
            await self._status(action)

    async def _cache_action(
        self, action: Action, endpoints: dict[str, DesiredEndpoint], now_s: float
    ) -> None:
        c, ns = self._client, self._ns
        if isinstance(action, ApplyModelCache):
            await self._apply_model_cache(action, endpoints.get(action.spec.owner), now_s)
        elif isinstance(action, ApplyImageCache):
            spec = _wire(action.spec)
            body = render.cache_object(IMAGE_CACHE, action.name, ns, spec, now_s=now_s)
            # unless warmfleet did not make it (checked on the version patched)
            await ownership.apply_shared(c, kube.IMAGE_CACHES, IMAGE_CACHE, body, _spec_patch(spec))
        elif isinstance(action, DeleteModelCache):
            await self._delete_read(kube.MODEL_CACHES, action.name)
        elif isinstance(action, DeleteImageCache):
            await self._delete_read(kube.IMAGE_CACHES, action.name)
        elif isinstance(action, ApplyImagePuller):
            body = render.image_puller(action.cache, action.image, dict(action.node_selector), ns)
            await ownership.apply_shared(c, kube.DAEMONSETS, "DaemonSet", body)  # not a user's
        elif isinstance(action, DeleteImagePuller):
            await self._delete_read(kube.DAEMONSETS, names.puller_name(action.cache), False)

    async def _apply_model_cache(
        self, action: ApplyModelCache, owner: DesiredEndpoint | None, now_s: float
    ) -> None:
        """Create or update the endpoint's ModelCache, unless another holder has it (checked
        on the version patched, ``ownership.apply_owned``)."""
        if owner is None:  # the plan asks only for listed endpoints' caches
            log.warning(
                "ModelCache %s: %s is not listed: not written", action.name, action.spec.owner
            )
            return
        spec = _wire(action.spec)
        body = render.cache_object(
            "ModelCache", action.name, self._ns, spec, now_s=now_s, owner=owner
        )
        await ownership.apply_owned(
            self._client, kube.MODEL_CACHES, MODEL_CACHE, body, owner, patch=_spec_patch(spec)
        )

    async def _delete_read(self, resource: kube.Resource, name: str, version: bool = True) -> None:
        """Delete ``name`` as this pass read it (``ownership.delete_as_read``)."""
        obj = self._read.get((resource.plural, name))
        if obj is None:  # the plan deletes only what the pass read
            log.warning("%s %s: not read this pass: not deleted", resource.plural, name)
            return
        await ownership.delete_as_read(self._client, resource, self._ns, obj, version=version)

    async def _node_action(self, action: AssignNodeCaches | SetNodeLabels) -> None:
        if isinstance(action, AssignNodeCaches):
            value = render.assignments(action.caches)
            metadata: Obj = {"annotations": {render.ANN_ASSIGNED: value}}
        else:
            labels: dict[str, str | None] = dict.fromkeys(action.remove)
            labels.update(action.set_labels)
            metadata = {"labels": labels}
        await self._client.patch(kube.NODES, None, action.node, {"metadata": metadata})

    async def _workload_action(
        self,
        action: _WorkloadAction,
        endpoints: dict[str, DesiredEndpoint],
        result: PassResult,
    ) -> None:
        c, ns = self._client, self._ns
        if isinstance(action, ApplyDeployment):
            plan, owner = action.plan, endpoints[action.plan.endpoint]
            body = render.deployment(plan, ns, owner.uid)
            exact = render.DEPLOYMENT_EXACT_PATHS
            if await ownership.apply_owned(
                c, kube.DEPLOYMENTS, names.DEPLOYMENT, body, owner, exact=exact
            ):
                for variant in (None, plan.variant):
                    await self._apply_service(owner, plan.port, variant)
        elif isinstance(action, ScaleDeployment):
            await self._scale(action, endpoints)
        elif isinstance(action, DeleteDeployment):
            await self._delete_read(kube.DEPLOYMENTS, action.name, False)  # its status moves
        else:
            # its Service and its variants' (ownerReferences would do it; kmock has no GC)
            endpoint = endpoints[action.name]
            for service in await c.list(kube.SERVICES, ns, {names.LABEL_ENDPOINT: action.name}):
                if ownership.owned(names.SERVICE, service, endpoint):
                    await ownership.delete_as_read(c, kube.SERVICES, ns, service)
            result.released.add(action.name)

    async def _scale(self, action: ScaleDeployment, endpoints: dict[str, DesiredEndpoint]) -> None:
        """Scale the Deployment as this pass read it, while it is its endpoint's
        (``ownership.patch_as_read``: not one made again since, by a user or another owner)."""
        read = self._read.get((kube.DEPLOYMENTS.plural, action.name))
        labels = ((read or {}).get("metadata") or {}).get("labels") or {}
        owner = endpoints.get(str(labels.get(names.LABEL_ENDPOINT)))
        if read is None or owner is None:  # the plan scales only what the pass read
            why = "not read this pass" if read is None else "no listed endpoint's"
            log.warning("deployments %s: %s: not scaled", action.name, why)
            return
        patch = {"spec": {"replicas": action.replicas}}
        owned = (names.DEPLOYMENT, owner)
        await ownership.patch_as_read(
            self._client, kube.DEPLOYMENTS, self._ns, read, patch, owner=owned
        )

    async def _status(self, action: Action) -> None:
        """The status of the object as this pass read it (its uid: not to an object deleted
        and created again since, ``ownership.patch_as_read``)."""
        if isinstance(action, UpdateEndpointStatus):
            resource, name, status = kube.ENDPOINTS, action.name, action.status
        elif isinstance(action, UpdateModelCacheStatus):
            resource, name, status = kube.MODEL_CACHES, action.name, action.status  # type: ignore[assignment]
        elif isinstance(action, UpdateImageCacheStatus):
            resource, name, status = kube.IMAGE_CACHES, action.name, action.status  # type: ignore[assignment]
        else:
            raise TypeError(f"unknown action {action!r}")
        read = self._read.get((resource.plural, name))
        if read is None:  # the plan gives a status only to what the pass read
            log.warning("%s %s: not read this pass: no status written", resource.plural, name)
            return
        body = {"status": status.model_dump(mode="json", by_alias=True)}
        await ownership.patch_as_read(self._client, resource, self._ns, read, body, sub="status")


def _read_index(snap: Snapshot) -> dict[tuple[str, str], Obj]:
    """The objects a pass may delete, scale or give a status to, as it read them, by (plural,
    name)."""
    found: dict[tuple[str, str], Obj] = {}
    for resource, objs in (
        (kube.ENDPOINTS, snap.endpoints),
        (kube.MODEL_CACHES, snap.model_caches),
        (kube.IMAGE_CACHES, snap.image_caches),
        (kube.DEPLOYMENTS, snap.deployments),
        (kube.DAEMONSETS, snap.daemonsets),
    ):
        for obj in objs:
            found[resource.plural, str((obj.get("metadata") or {}).get("name"))] = obj
    return found


def _spec_patch(spec: Obj) -> Callable[[Obj], Obj]:
    """The merge patch that makes a cache's ``spec`` exactly ``spec`` (keys it lacks go)."""
    return lambda current: {"spec": kube.merge_patch(current.get("spec"), spec)}


def _deployed_variants(deployments: list[Obj]) -> set[tuple[str, str]]:
    """(endpoint, variant) of each Deployment the operator made."""
    found = set()
    for deployment in deployments:
        labels = (deployment.get("metadata") or {}).get("labels") or {}
        if labels.get(names.LABEL_MANAGED_BY) != names.MANAGER:
            continue
        endpoint, variant = labels.get(names.LABEL_ENDPOINT), labels.get(names.LABEL_VARIANT)
        if isinstance(endpoint, str) and isinstance(variant, str):
            found.add((endpoint, variant))
    return found


def _wire(model: Any) -> Obj:
    data: Obj = model.model_dump(mode="json", by_alias=True)
    return data
