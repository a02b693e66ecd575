"""The fleet reconciler: ``plan(desired, observed) -> list[Action]`` (pure, level-triggered).

It never remembers anything between calls: every decision is recomputed from the desired
endpoints and the observed world, so replaying a plan is harmless and a plan against a world
where every action already took effect is empty. Order of the returned actions: caches and
node assignments first, then labels, deployments, deletions, statuses, finalizer releases.

Rules (docs/fleet-controller.md has the reasoning):
- a weights cache per endpoint revision, assigned to every ready node matching the selector
  (``control.wanted``; none while another holds its name, ``control.claims``: ModelCaches no
  endpoint holds are not the plan's at all);
- an image cache per (image, node selector), shared, refcounted by ``parentReferences`` (none
  while an ImageCache of its name is one warmfleet does not manage: those are not the plan's);
- the first Deployment of a revision waits for the weights gate; images never gate;
- rollover: new cache -> gate -> new Deployments -> all new replicas ready -> old Deployments
  deleted -> old cache unassigned -> its data gone -> old cache deleted; with a Rolling
  ``rollout`` the new Deployments grow and the old ones shrink step by step instead, within
  maxSurge/maxUnavailable (``control/rollout.py``);
- a node's ready label exists only while its agent reports the cache ready and healthy;
- a deleted endpoint is released only when its Deployments, caches, data and refs are gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from warmfleet.api import names
from warmfleet.api.resources import ProductionVariant
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
    DeploymentPlan,
    NodeCacheAssignment,
    ReleaseEndpoint,
    ScaleDeployment,
    SetNodeLabels,
    UpdateEndpointStatus,
)
from warmfleet.control.cache_status import cache_status_actions
from warmfleet.control.claims import (
    IMAGE_CACHE,
    MODEL_CACHE,
    PULLER,
    Conflicts,
    blocked,
    foreign,
    name_conflicts,
)
from warmfleet.control.endpoint_status import endpoint_status, variant_replicas
from warmfleet.control.observed import DesiredEndpoint, ObservedDeployment, ObservedState
from warmfleet.control.placement import preferences
from warmfleet.control.rollout import rolling_step
from warmfleet.control.status import count, gate_decision, target_nodes
from warmfleet.control.wanted import Wanted
from warmfleet.control.wanted import wanted as wanted_caches


def plan(
    desired: Sequence[DesiredEndpoint], observed: ObservedState, conflicts: Conflicts | None = None
) -> list[Action]:
    endpoints = sorted(desired, key=lambda e: e.name)
    conflicts = name_conflicts(endpoints, observed) if conflicts is None else conflicts
    observed = _by_name(observed)
    wanted = wanted_caches(endpoints, observed, conflicts)
    actions: list[Action] = []
    actions += _model_cache_objects(wanted, observed)
    actions += _image_cache_objects(wanted, observed)
    actions += _assignments(wanted, observed)
    actions += _labels(wanted, observed)
    for endpoint in endpoints:
        taken = blocked(conflicts.get(endpoint.name, ()), names.DEPLOYMENT)
        actions += _deployments(endpoint, observed, taken)
    actions += _collect_garbage(wanted, observed)
    actions += _statuses(endpoints, wanted, observed, conflicts)
    actions += _releases(endpoints, observed)
    return actions


def _by_name(observed: ObservedState) -> ObservedState:
    """The observed collections in name order: the plan (its action order included) must not
    depend on the order a backend listed things in. Caches no endpoint holds (a ModelCache of
    no endpoint, an ImageCache warmfleet does not manage) are left out: warmfleet neither
    writes, deletes, gives a status to nor waits for them (``claims.foreign``)."""
    not_models = foreign(observed, MODEL_CACHE)
    models = (c for c in observed.model_caches if c.name not in not_models)
    not_images = foreign(observed, IMAGE_CACHE)
    images = (c for c in observed.image_caches if c.name not in not_images)
    return replace(
        observed,
        nodes=tuple(sorted(observed.nodes, key=lambda n: n.name)),
        model_caches=tuple(sorted(models, key=lambda c: c.name)),
        image_caches=tuple(sorted(images, key=lambda c: c.name)),
        deployments=tuple(sorted(observed.deployments, key=lambda d: d.name)),
    )


# ------------------------------------------------------------------------------ caches


def _model_cache_objects(wanted: Wanted, observed: ObservedState) -> list[Action]:
    actions: list[Action] = []
    for name, spec in sorted(wanted.model_caches.items()):
        current = observed.model_cache(name)
        if current is None or current.spec != spec:
            actions.append(ApplyModelCache(name, spec))
    return actions


def _image_cache_objects(wanted: Wanted, observed: ObservedState) -> list[Action]:
    """The wanted ImageCaches and their pullers (not one whose name someone else's DaemonSet
    has: the endpoints report it, ``claims``)."""
    actions: list[Action] = []
    theirs = foreign(observed, PULLER)
    for name in sorted(wanted.image_images):
        spec = wanted.image_spec(name)
        current = observed.image_cache(name)
        if current is None or current.spec != spec:
            actions.append(ApplyImageCache(name, spec))
        if (current is None or not current.puller) and names.puller_name(name) not in theirs:
            actions.append(ApplyImagePuller(name, spec.image, dict(spec.node_selector)))
    return actions


def _assignments(wanted: Wanted, observed: ObservedState) -> list[Action]:
    actions: list[Action] = []
    for node in observed.nodes:
        if not node.ready:
            continue  # nobody to tell; its labels are removed below
        caches = tuple(
            NodeCacheAssignment(name, spec.model_source, spec.host_path)
            for name, spec in sorted(wanted.model_caches.items())
            if spec.enabled and node.matches(spec.node_selector)
        )
        if frozenset(a.key() for a in caches) != node.told:  # sources re-signed in place too
            actions.append(AssignNodeCaches(node.name, caches))
    return actions


def _labels(wanted: Wanted, observed: ObservedState) -> list[Action]:
    actions: list[Action] = []
    for node in observed.nodes:
        target: dict[str, str] = {}
        if node.ready:
            for name, spec in wanted.model_caches.items():
                report = node.weights.get(name)
                if node.matches(spec.node_selector) and report is not None and report.usable:
                    target[names.weights_label(name)] = names.READY_VALUE
            for name, (_, selector) in wanted.image_images.items():
                report = node.images.get(name)
                if node.matches(selector) and report is not None and report.usable:
                    target[names.image_label(name)] = names.READY_VALUE
        current = {k: v for k, v in node.labels.items() if names.is_managed_label(k)}
        to_set = {k: v for k, v in sorted(target.items()) if current.get(k) != v}
        to_remove = tuple(sorted(k for k in current if k not in target))
        if to_set or to_remove:
            actions.append(SetNodeLabels(node.name, to_set, to_remove))
    return actions


# ------------------------------------------------------------------------------ deployments


def deployment_plan(endpoint: DesiredEndpoint, variant: ProductionVariant) -> DeploymentPlan:
    spec = endpoint.spec
    config = spec.model_cache_config
    rev = names.revision(spec)
    model_cache = (
        names.model_cache_name(endpoint.name, spec) if config.weights_cache.enabled else None
    )
    image_cache = (
        names.image_cache_name(spec.image, spec.node_selector)
        if config.image_cache.enabled
        else None
    )
    return DeploymentPlan(
        name=names.deployment_name(endpoint.name, variant.name, rev),
        endpoint=endpoint.name,
        variant=variant.name,
        revision=rev,
        replicas=variant_replicas(endpoint, variant),
        image=spec.image,
        port=spec.port,
        command=spec.command,
        args=spec.args,
        gpus_per_replica=spec.gpus_per_replica,
        model_source=spec.model_source,
        model_cache=model_cache,
        host_path=config.weights_cache.host_path if model_cache else None,
        image_cache=image_cache,
        node_selector=dict(spec.node_selector),
        preferences=preferences(model_cache, image_cache),
        update_bounds=(spec.rollout.surge, spec.rollout.unavailable),
    )


def gate_is_open(endpoint: DesiredEndpoint, observed: ObservedState) -> tuple[bool, str, str]:
    """(open, reason, message) of the weights gate for the endpoint's current revision."""
    weights = endpoint.spec.model_cache_config.weights_cache
    if not weights.enabled:
        return True, "CachingDisabled", "weights cache disabled"
    name = names.model_cache_name(endpoint.name, endpoint.spec)
    cache = observed.model_cache(name)
    nodes = target_nodes(observed.nodes, endpoint.spec.node_selector)
    counts = count([n.weights.get(name) for n in nodes])
    age = None if cache is None else max(0.0, observed.now_s - cache.created_s)
    decision = gate_decision(weights.gate, counts, age)
    return decision.open, decision.reason, decision.message


def _deployments(
    endpoint: DesiredEndpoint, observed: ObservedState, taken: frozenset[str]
) -> list[Action]:
    mine = [d for d in observed.deployments if d.endpoint == endpoint.name]
    if endpoint.deleting:
        return [DeleteDeployment(d.name) for d in sorted(mine, key=lambda d: d.name)]
    rev = names.revision(endpoint.spec)
    current = {d.variant: d for d in mine if d.revision == rev}
    plans = [deployment_plan(endpoint, v) for v in endpoint.spec.variants]
    gate_open = gate_is_open(endpoint, observed)[0]
    rolling = endpoint.spec.rollout.type == "Rolling"
    actions: list[Action] = []
    retired: set[str] = set()
    if current or gate_open:
        for p in plans:
            if p.name in taken:  # held elsewhere: the variant keeps its older revision
                continue
            have = current.get(p.variant)
            if have is not None and not gate_open:
                p = _keep_cache(p, have)
            older = [d for d in mine if d.revision != rev and d.variant == p.variant]
            if rolling and older:
                step = rolling_step(p.replicas, endpoint.spec.rollout, have, older)
                p = replace(p, replicas=step.new_replicas)
                actions += _shrink(older, step.old_replicas, retired)
            if have is None or _differs(have, p):
                actions.append(ApplyDeployment(p))
    variant_names = {p.variant for p in plans}
    stale = [d for d in current.values() if d.variant not in variant_names]
    if _revision_ready(plans, current):
        stale += [d for d in mine if d.revision != rev]
    stale = [d for d in stale if d.name not in retired]
    actions += [DeleteDeployment(d.name) for d in sorted(stale, key=lambda d: d.name)]
    return actions


def _differs(have: ObservedDeployment, p: DeploymentPlan) -> bool:
    return (
        have.spec_hash != p.spec_hash()
        or have.replicas != p.replicas
        or (have.update_bounds is not None and have.update_bounds != p.update_bounds)
    )


def _shrink(
    older: Sequence[ObservedDeployment], targets: dict[str, int], retired: set[str]
) -> list[Action]:
    """Scale the old revision's Deployments to a rolling step's targets; delete those at 0."""
    actions: list[Action] = []
    for dep in older:
        target = targets[dep.name]
        if target == 0:
            actions.append(DeleteDeployment(dep.name))
            retired.add(dep.name)
        elif target != dep.replicas:
            actions.append(ScaleDeployment(dep.name, target))
    return actions


def _keep_cache(p: DeploymentPlan, have: ObservedDeployment) -> DeploymentPlan:
    """While the gate is closed, a running Deployment keeps the weights cache it loads from
    (enabling caching does not change the revision, so it is an in-place update): it still
    scales, and it switches to the new cache only once that cache passes the gate."""
    if have.model_cache == p.model_cache:
        return p
    return replace(
        p,
        model_cache=have.model_cache,
        host_path=p.host_path if have.model_cache else None,
        preferences=preferences(have.model_cache, p.image_cache),
    )


def _revision_ready(
    plans: Sequence[DeploymentPlan], current: dict[str, ObservedDeployment]
) -> bool:
    for p in plans:
        have = current.get(p.variant)
        if have is None or have.spec_hash != p.spec_hash() or have.ready_replicas < p.replicas:
            return False
    return True


# ------------------------------------------------------------------------------ GC, status


def _collect_garbage(wanted: Wanted, observed: ObservedState) -> list[Action]:
    actions: list[Action] = []
    for cache in observed.model_caches:
        if cache.name in wanted.model_caches:
            continue
        still_held = any(
            cache.name in n.assigned or cache.name in n.weights for n in observed.nodes if n.ready
        )
        if not still_held:
            actions.append(DeleteModelCache(cache.name))
    for image in observed.image_caches:
        if image.name in wanted.image_images:
            continue
        if image.puller:
            actions.append(DeleteImagePuller(image.name))
            continue
        label = names.image_label(image.name)
        if not any(label in n.labels for n in observed.nodes):
            actions.append(DeleteImageCache(image.name))
    ours = {image.name for image in observed.image_caches} | wanted.image_images.keys()
    orphans = sorted(observed.pullers - ours)  # their ImageCache gone, or someone else's now
    actions += [DeleteImagePuller(name) for name in orphans]
    return actions


def _statuses(
    endpoints: Sequence[DesiredEndpoint], wanted: Wanted, observed: ObservedState, c: Conflicts
) -> list[Action]:
    actions = cache_status_actions(set(wanted.model_caches), set(wanted.image_images), observed)
    for endpoint in endpoints:
        gate = gate_is_open(endpoint, observed)
        status = endpoint_status(endpoint, observed, gate, c.get(endpoint.name, ()))
        if status != endpoint.status:
            actions.append(UpdateEndpointStatus(endpoint.name, status))
    return actions


def _releases(endpoints: Sequence[DesiredEndpoint], observed: ObservedState) -> list[Action]:
    actions: list[Action] = []
    for endpoint in (e for e in endpoints if e.deleting):
        busy = (
            any(d.endpoint == endpoint.name for d in observed.deployments)
            or any(c.spec.owner == endpoint.name for c in observed.model_caches)
            or any(
                p.name == endpoint.name and p.namespace == endpoint.namespace
                for c in observed.image_caches
                for p in c.spec.parent_references
            )
        )
        if not busy:
            actions.append(ReleaseEndpoint(endpoint.name))
    return actions
