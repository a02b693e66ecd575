"""Who controls a Deployment, Service or ModelCache (and whether warmfleet made an ImageCache),
and writes that leave other owners' objects alone.

An object an endpoint makes carries a controller ``ownerReference`` to it (and warmfleet's
labels); an ImageCache, shared by the endpoints that pull its image, warmfleet's label alone.
Names derived from endpoint and variant names can collide (``control.claims``), and anyone may
create an object of a name the operator derives: the operator updates an existing object only
if its controller is the endpoint it acts for (an ImageCache: only if warmfleet made it),
checked on the very version it patches (a change meanwhile is a 409 and the check runs again),
and deletes only the objects of that endpoint, as it read them (``delete_as_read``: an object
deleted and created again, or changed, since is left for the next pass). What it patches on an
object it read (a Deployment's replicas, a status) goes only to that very object
(``patch_as_read``: its uid, checked on the version patched). The refusals are logged; the
planner's ``NameConflict`` condition reports them in the losing endpoint's status.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

from warmfleet.api import names
from warmfleet.api.resources import Condition
from warmfleet.control.actions import Action, UpdateEndpointStatus
from warmfleet.control.claims import CONDITION, IMAGE_CACHE, MODEL_CACHE, PULLER, NameConflict
from warmfleet.control.observed import DesiredEndpoint, HeldName
from warmfleet.kube import client as kube
from warmfleet.kube.owners import controller_reference, is_endpoint_reference

log = logging.getLogger(__name__)
Obj = dict[str, Any]


def held_name(kind: str, obj: Obj) -> HeldName:
    """Who holds ``obj``: the InferenceEndpoint of its controller reference; without one, the
    endpoint its warmfleet labels name (objects of older operators); else nobody warmfleet
    knows (``owner`` says what it is)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    ref = controller_reference(obj)
    if ref is not None:
        if is_endpoint_reference(ref):
            return HeldName(kind, name, str(ref.get("name")), str(ref.get("uid") or ""))
        return HeldName(kind, name, None, owner=f"{ref.get('kind')} {ref.get('name')}")
    labels = meta.get("labels") or {}
    endpoint = labels.get(names.LABEL_ENDPOINT)
    if kind == MODEL_CACHE and endpoint is None:  # a cache names its endpoint in its spec
        endpoint = (obj.get("spec") or {}).get("owner")
    if labels.get(names.LABEL_MANAGED_BY) == names.MANAGER and isinstance(endpoint, str):
        return HeldName(kind, name, endpoint)
    return HeldName(kind, name, None)


def shared_holder(kind: str, obj: Obj) -> HeldName | None:
    """Who holds an object warmfleet makes for no one endpoint (an ImageCache, shared by the
    endpoints its ``parentReferences`` name; its puller DaemonSet). None: warmfleet made it (its
    label, no controller); else nobody warmfleet could give it to (``owner``: its controller,
    if it has one)."""
    meta = obj.get("metadata") or {}
    ref = controller_reference(obj)
    if ref is None and (meta.get("labels") or {}).get(names.LABEL_MANAGED_BY) == names.MANAGER:
        return None
    owner = f"{ref.get('kind')} {ref.get('name')}" if ref is not None else ""
    return HeldName(kind, str(meta.get("name", "")), None, owner=owner)


def held_names(
    deployments: Sequence[Obj],
    services: Sequence[Obj],
    model_caches: Sequence[Obj] = (),
    image_caches: Sequence[Obj] = (),
    daemonsets: Sequence[Obj] = (),
) -> tuple[HeldName, ...]:
    """The holders of the objects whose names endpoints derive (of the ImageCaches and
    DaemonSets, those warmfleet did not make: its own are every endpoint's that references
    them)."""
    theirs = [shared_holder(IMAGE_CACHE, c) for c in image_caches]
    theirs += [shared_holder(PULLER, d) for d in daemonsets]
    return (
        tuple(held_name(names.DEPLOYMENT, d) for d in deployments)
        + tuple(held_name(names.SERVICE, s) for s in services)
        + tuple(held_name(MODEL_CACHE, c) for c in model_caches)
        + tuple(h for h in theirs if h is not None)
    )


def owned(kind: str, obj: Obj, endpoint: DesiredEndpoint) -> bool:
    return held_name(kind, obj).owned_by(endpoint.name, endpoint.uid)


class _NotOwned(Exception):
    def __init__(self, held: HeldName) -> None:
        super().__init__(held.name)
        self.held = held


class _NotAsRead(Exception):
    """The object is not the one the pass read (deleted and created again since)."""


async def apply_owned(
    client: kube.KubeClient,
    resource: kube.Resource,
    kind: str,
    body: Obj,
    endpoint: DesiredEndpoint,
    *,
    exact: Sequence[tuple[str, ...]] = (),
    patch: Callable[[Obj], Obj] | None = None,
) -> bool:
    """``KubeClient.apply`` of the endpoint's ``body`` (create, or merge-patch, ``exact`` paths
    as rendered; ``patch``: the merge patch for the current object instead), unless the object
    exists and is not the endpoint's: then nothing is written, a warning is logged and the
    result is False."""

    def refuse(current: Obj) -> HeldName | None:
        held = held_name(kind, current)
        return None if held.owned_by(endpoint.name, endpoint.uid) else held

    def change(current: Obj) -> Obj:
        return kube.exact_patch(current, body, exact) if patch is None else patch(current)

    return await _apply_unless(client, resource, body, refuse, change, endpoint=endpoint.name)


async def apply_shared(
    client: kube.KubeClient,
    resource: kube.Resource,
    kind: str,
    body: Obj,
    patch: Callable[[Obj], Obj] | None = None,
) -> bool:
    """``KubeClient.apply`` of ``body``, an object warmfleet shares among endpoints (``patch``:
    the merge patch for the current object instead), unless the object exists and warmfleet
    did not make it (``shared_holder``, checked on the version patched): then nothing is
    written, a warning is logged and the result is False."""

    def change(current: Obj) -> Obj:
        return kube.exact_patch(current, body, ()) if patch is None else patch(current)

    def refuse(current: Obj) -> HeldName | None:
        return shared_holder(kind, current)

    return await _apply_unless(client, resource, body, refuse, change, endpoint=None)


async def _apply_unless(
    client: kube.KubeClient,
    resource: kube.Resource,
    body: Obj,
    refuse: Callable[[Obj], HeldName | None],
    change: Callable[[Obj], Obj],
    *,
    endpoint: str | None,
) -> bool:
    """Create ``body`` or patch the object to ``change(current)``, unless ``refuse(current)``
    names another holder (logged for ``endpoint``, None: a shared object): False."""
    meta = body["metadata"]

    def checked(current: Obj) -> Obj:
        held = refuse(current)
        if held is not None:
            raise _NotOwned(held)
        return change(current)

    try:
        await client.update(resource, meta.get("namespace"), meta["name"], checked, create=body)
    except _NotOwned as refused:
        _left_alone(endpoint, refused.held)
        return False
    return True


def _left_alone(endpoint: str | None, held: HeldName) -> None:
    conflict = NameConflict(held.kind, held.name, held.holder(endpoint or ""))
    who = "" if endpoint is None else f"InferenceEndpoint {endpoint}: "
    log.warning("%s%s: left alone", who, conflict.message())


async def patch_as_read(
    client: kube.KubeClient,
    resource: kube.Resource,
    namespace: str | None,
    read: Obj,
    patch: Obj,
    *,
    sub: str | None = None,
    owner: tuple[str, DesiredEndpoint] | None = None,
) -> bool:
    """Merge-patch (``sub``: that subresource, e.g. ``status``) the object the pass ``read``,
    only if it is still that object (its uid) and, with ``owner`` (kind, endpoint), still that
    endpoint's: checked on the very version patched (its resourceVersion goes in the patch: a
    change meanwhile is a 409, and the check runs again on a fresh read). One deleted and
    created again since, or gone, is not written: logged and left to the next pass, which
    reads and decides again; the result is False. A refused owner is logged as a warning."""
    meta = read.get("metadata") or {}
    name, uid = str(meta["name"]), str(meta.get("uid") or "")

    def change(current: Obj) -> Obj:
        now = (current.get("metadata") or {}).get("uid")
        if uid and now != uid:
            raise _NotAsRead(f"its uid is {now}, the one read {uid}")
        if owner is not None:
            held = held_name(owner[0], current)
            if not held.owned_by(owner[1].name, owner[1].uid):
                raise _NotOwned(held)
        return copy.deepcopy(patch)  # ``update`` adds the version read to it

    try:
        return await client.update(resource, namespace, name, change, sub=sub) is not None
    except _NotOwned as refused:
        _left_alone(owner[1].name if owner else None, refused.held)
        return False
    except (_NotAsRead, kube.KubeError) as err:
        if isinstance(err, kube.KubeError) and err.status not in (kube.CONFLICT, 404):
            raise
        what = f"{sub} not written" if sub else "not patched"
        log.info(
            "%s %s changed since it was read: %s, read again next pass (%s)",
            resource.plural,
            name,
            what,
            err,
        )
        return False


async def delete_as_read(
    client: kube.KubeClient,
    resource: kube.Resource,
    namespace: str | None,
    obj: Obj,
    *,
    version: bool = True,
) -> bool:
    """Delete ``obj`` as the pass read it: its uid and (``version``) its resourceVersion are
    the delete's preconditions, so an object deleted and created again since (by a user, by
    another owner) or changed since is not deleted. That refusal (409) is logged and left to
    the next pass, which reads and decides again: the result is False. ``version`` False: for
    objects whose status their controller keeps changing (a Deployment's), the uid alone."""
    meta = obj.get("metadata") or {}
    name, uid = str(meta["name"]), str(meta.get("uid") or "")
    rv = str(meta.get("resourceVersion") or "") if version else ""
    try:
        await client.delete(resource, namespace, name, uid=uid, resource_version=rv)
    except kube.KubeError as err:
        if err.status != kube.CONFLICT:
            raise
        log.info(
            "%s %s changed since it was read: not deleted, read again next pass (%s)",
            resource.plural,
            name,
            err,
        )
        return False
    return True


def report_conflicts(actions: Sequence[Action], endpoints: dict[str, DesiredEndpoint]) -> None:
    """Log each endpoint's ``NameConflict`` condition when it appears, changes or clears (the
    status says it all along; the log says when)."""
    for action in actions:
        if not isinstance(action, UpdateEndpointStatus):
            continue
        before = endpoints.get(action.name)
        old = _conflict_message(before.status.conditions if before and before.status else ())
        new = _conflict_message(action.status.conditions)
        if new and new != old:
            log.warning("InferenceEndpoint %s: name conflict: %s", action.name, new)
        elif old and not new:
            log.info("InferenceEndpoint %s: name conflict resolved (%s)", action.name, old)


def _conflict_message(conditions: Sequence[Condition]) -> str:
    return next((c.message for c in conditions if c.type == CONDITION), "")
