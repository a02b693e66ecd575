"""Kubernetes objects -> the reconciler's ``DesiredEndpoint`` list and ``ObservedState``."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from warmfleet.api import names
from warmfleet.api.resources import (
    CacheStatus,
    EndpointStatus,
    ImageCacheSpec,
    ImageCacheStatus,
    InferenceEndpointSpec,
    ModelCacheSpec,
)
from warmfleet.control.claims import IMAGE_CACHE, MODEL_CACHE, PULLER
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
from warmfleet.operator import render
from warmfleet.operator.ownership import held_names, shared_holder

log = logging.getLogger(__name__)
ANN_AUTOSCALED = "warmfleet.dev/autoscaled-replicas"
Obj = dict[str, Any]
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one pass reads. ``deployments``, ``services`` and the caches: all of the
    namespace's (those warmfleet does not manage hold names too, ``ownership``)."""

    endpoints: list[Obj]
    nodes: list[Obj]
    model_caches: list[Obj]
    image_caches: list[Obj]
    deployments: list[Obj]
    daemonsets: list[Obj]
    pods: list[Obj]
    services: list[Obj] = field(default_factory=list)


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _annotations(obj: Obj) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _optional(model: type[M], data: Any) -> M | None:
    if not isinstance(data, dict):
        return None
    try:
        return model.model_validate({k: v for k, v in data.items() if k != "kopf"})
    except ValidationError:
        return None


def _deleting_spec(obj: Obj) -> InferenceEndpointSpec | None:
    """A deleting endpoint whose spec fails a check the CRD schema cannot make (a gate mode
    without its threshold): its model, image and variants alone, enough to collect what it
    owns (Deployments by name, caches by owner) and remove its finalizer. Skipped, it was never
    released and its deletion hung for good. None if even those do not validate."""
    raw = obj.get("spec") or {}
    core = {k: raw[k] for k in ("modelSource", "image", "variants") if k in raw}
    try:
        return InferenceEndpointSpec.model_validate(core)
    except ValidationError:
        return None


def desired_endpoints(snapshot: Snapshot) -> list[DesiredEndpoint]:
    result = []
    for obj in snapshot.endpoints:
        meta = _meta(obj)
        try:
            spec = InferenceEndpointSpec.model_validate(obj.get("spec") or {})
        except ValidationError as err:
            collected = _deleting_spec(obj) if meta.get("deletionTimestamp") else None
            if collected is None:
                log.warning(
                    "InferenceEndpoint %s: invalid spec, skipped: %s", meta.get("name"), err
                )
                continue
            spec = collected
        scaled = _autoscaled(meta.get("name"), _annotations(obj).get(ANN_AUTOSCALED))
        result.append(
            DesiredEndpoint(
                name=meta["name"],
                spec=spec,
                uid=meta.get("uid", ""),
                namespace=meta.get("namespace", "default"),
                deleting=bool(meta.get("deletionTimestamp")),
                autoscaled_replicas=scaled,
                status=_optional(EndpointStatus, obj.get("status")),
            )
        )
    return result


def _autoscaled(endpoint: str | None, raw: str | None) -> dict[str, int]:
    """The autoscaler's last decision (variant -> replicas); an unreadable value (e.g. a hand
    edit) counts as absent, so the variants run their declared replicas and the pass goes on."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        return {str(k): _replica_count(v) for k, v in data.items()}
    except (ValueError, TypeError) as err:
        log.warning(
            "InferenceEndpoint %s: unreadable %s annotation ignored (%s): %r",
            endpoint,
            ANN_AUTOSCALED,
            err,
            raw,
        )
        return {}


def _replica_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"replicas must be an integer, got {value!r}")
    return int(value)


def _reports(node: str, raw: str | None) -> dict[str, NodeCacheReport]:
    """A node agent's ``cache-status`` annotation; what cannot be read counts as not reported
    (one bad node must not stop the pass for every endpoint)."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        log.warning("node %s: unreadable %s annotation ignored", node, render.ANN_CACHE_STATUS)
        return {}
    out = {}
    for cache, r in data.items():
        try:
            out[str(cache)] = NodeCacheReport(
                state=NodeCacheState(r.get("state", "pending")),
                bytes_done=int(r.get("bytesDone", 0)),
                bytes_total=int(r.get("bytesTotal", 0)),
                healthy=bool(r.get("healthy", True)),
                message=str(r.get("message", "")),
            )
        except (AttributeError, TypeError, ValueError):
            log.warning("node %s: unreadable report for cache %s ignored: %r", node, cache, r)
    return out


def _told(node: str, raw: str | None) -> frozenset[tuple[str, str, str, str]]:
    """What the operator last assigned (``ObservedNode.told``; nothing when unreadable:
    re-assigned this pass)."""
    try:
        return frozenset(
            (str(a["cache"]), str(a.get("uri")), str(a.get("revision")), str(a.get("hostPath")))
            for a in json.loads(raw or "[]")
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("node %s: unreadable %s annotation", node, render.ANN_ASSIGNED)
        return frozenset()


def _pod_ready_s(pod: Obj) -> float | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime")) or 0.0
    return None


def _image_reports(pods: Sequence[Obj]) -> dict[str, dict[str, NodeCacheReport]]:
    """node -> image cache -> report, from the image puller pods."""
    out: dict[str, dict[str, NodeCacheReport]] = {}
    for pod in pods:
        cache = (_meta(pod).get("labels") or {}).get(render.LABEL_IMAGE_CACHE)
        node = (pod.get("spec") or {}).get("nodeName")
        if not cache or not node:
            continue
        state = (
            NodeCacheState.READY if _pod_ready_s(pod) is not None else NodeCacheState.DOWNLOADING
        )
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason", "")
            if reason in {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}:
                state = NodeCacheState.FAILED
        out.setdefault(node, {})[cache] = NodeCacheReport(state)
    return out


def _nodes(snapshot: Snapshot) -> tuple[ObservedNode, ...]:
    images = _image_reports(snapshot.pods)
    nodes = []
    for obj in snapshot.nodes:
        meta = _meta(obj)
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready_conds = [c for c in conditions if c.get("type") == "Ready"]
        ready = not ready_conds or ready_conds[0].get("status") == "True"
        name, annotations = meta["name"], _annotations(obj)
        told = _told(name, annotations.get(render.ANN_ASSIGNED))
        nodes.append(
            ObservedNode(
                name=name,
                labels=dict(meta.get("labels") or {}),
                ready=ready and not (obj.get("spec") or {}).get("unschedulable", False),
                told=told,
                weights=_reports(name, annotations.get(render.ANN_CACHE_STATUS)),
                images=images.get(meta["name"], {}),
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.name))


def _created(obj: Obj, now_s: float) -> float:
    stamp = _annotations(obj).get(render.ANN_CREATED)
    if stamp:
        return float(stamp)
    return parse_time(_meta(obj).get("creationTimestamp")) or now_s


def pulled_caches(daemonsets: Sequence[Obj]) -> frozenset[str]:
    """The image caches whose puller is among ``daemonsets`` (those warmfleet made: a user's
    DaemonSet of a puller's name is no puller)."""
    return frozenset(
        cache
        for d in daemonsets
        if shared_holder(PULLER, d) is None
        and isinstance(cache := (_meta(d).get("labels") or {}).get(render.LABEL_IMAGE_CACHE), str)
        and _meta(d).get("name") == names.puller_name(cache)
    )


def _caches(
    snapshot: Snapshot, now_s: float, pullers: frozenset[str]
) -> tuple[tuple[ObservedModelCache, ...], tuple[ObservedImageCache, ...]]:
    """The caches observed; ``pullers``: the image caches whose puller warmfleet made."""
    models = []
    for obj in snapshot.model_caches:
        spec = _optional(ModelCacheSpec, obj.get("spec"))
        if spec is not None:
            status = _optional(CacheStatus, obj.get("status"))
            models.append(
                ObservedModelCache(_meta(obj)["name"], spec, _created(obj, now_s), status)
            )
    images = []
    for obj in snapshot.image_caches:
        name = _meta(obj)["name"]
        image_spec = _optional(ImageCacheSpec, obj.get("spec"))
        if image_spec is not None:
            image_status = _optional(ImageCacheStatus, obj.get("status"))
            puller = name in pullers
            images.append(
                ObservedImageCache(name, image_spec, _created(obj, now_s), image_status, puller)
            )
    return tuple(models), tuple(images)


def _replica(pod: Obj) -> ObservedReplica | None:
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or _meta(pod).get("deletionTimestamp"):
        return None
    started = parse_time((pod.get("status") or {}).get("startTime")) or 0.0
    prepared = _annotations(pod).get(render.ANN_PREPARED) == "true"
    return ObservedReplica(_meta(pod)["name"], node, started, _pod_ready_s(pod), prepared)


def _deployments(snapshot: Snapshot) -> tuple[ObservedDeployment, ...]:
    result = []
    for obj in snapshot.deployments:
        meta = _meta(obj)
        labels = meta.get("labels") or {}
        if (
            labels.get(names.LABEL_MANAGED_BY) != names.MANAGER
            or names.LABEL_ENDPOINT not in labels
        ):
            continue
        key = (
            labels[names.LABEL_ENDPOINT],
            labels.get(names.LABEL_VARIANT),
            labels.get(names.LABEL_REVISION),
        )
        pods = [
            r
            for p in snapshot.pods
            if (pl := _meta(p).get("labels") or {})
            and (
                pl.get(names.LABEL_ENDPOINT),
                pl.get(names.LABEL_VARIANT),
                pl.get(names.LABEL_REVISION),
            )
            == key
            and (r := _replica(p)) is not None
        ]
        ann = _annotations(obj)
        result.append(
            ObservedDeployment(
                name=meta["name"],
                endpoint=key[0],
                variant=str(key[1]),
                revision=str(key[2]),
                replicas=int((obj.get("spec") or {}).get("replicas", 0)),
                model_cache=ann.get(render.ANN_MODEL_CACHE) or None,
                image_cache=ann.get(render.ANN_IMAGE_CACHE) or None,
                spec_hash=ann.get(render.ANN_SPEC_HASH, ""),
                pods=tuple(sorted(pods, key=lambda r: r.name)),
                update_bounds=_update_bounds(obj),
            )
        )
    return tuple(sorted(result, key=lambda d: d.name))


def _update_bounds(deployment: Obj) -> tuple[int | str, int | str] | None:
    """(maxSurge, maxUnavailable) of a RollingUpdate strategy; None for anything else."""
    strategy = (deployment.get("spec") or {}).get("strategy")
    rolling = strategy.get("rollingUpdate") if isinstance(strategy, dict) else None
    if not isinstance(rolling, dict):
        return None
    surge, unavailable = rolling.get("maxSurge"), rolling.get("maxUnavailable")
    if isinstance(surge, int | str) and isinstance(unavailable, int | str):
        return surge, unavailable
    return None


def observed_state(snapshot: Snapshot, now_s: float) -> ObservedState:
    pullers = pulled_caches(snapshot.daemonsets)
    models, images = _caches(snapshot, now_s, pullers)
    return ObservedState(
        now_s=now_s,
        nodes=_nodes(snapshot),
        model_caches=models,
        image_caches=images,
        deployments=_deployments(snapshot),
        held=held_names(
            snapshot.deployments,
            snapshot.services,
            snapshot.model_caches,
            snapshot.image_caches,
            snapshot.daemonsets,
        ),
        named_kinds=frozenset({names.DEPLOYMENT, names.SERVICE, MODEL_CACHE, IMAGE_CACHE, PULLER}),
        pullers=pullers,
    )
