"""Who controls a Deployment or Service, and writes that leave other owners' objects alone.

An object an endpoint makes carries a controller ``ownerReference`` to it (and warmfleet's
labels). Names derived from endpoint and variant names can collide (``control.claims``): the
operator updates an existing object only if its controller is the endpoint it acts for, checked
on the very version it patches (a change meanwhile is a 409 and the check runs again), and
deletes only the objects of that endpoint. The refusals are logged; the planner's
``NameConflict`` condition reports them in the losing endpoint's status.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from warmfleet.api import names
from warmfleet.api.resources import Condition
from warmfleet.control.actions import Action, UpdateEndpointStatus
from warmfleet.control.claims import CONDITION, NameConflict
from warmfleet.control.observed import DesiredEndpoint, HeldName
from warmfleet.kube import client as kube

log = logging.getLogger(__name__)
Obj = dict[str, Any]
_API_GROUP = "warmfleet.dev/"


def held_name(kind: str, obj: Obj) -> HeldName:
    """Who holds ``obj``: the InferenceEndpoint of its controller reference; without one, the
    endpoint its warmfleet labels name (objects of older operators); else nobody warmfleet
    knows (``owner`` says what it is)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
    if refs:
        ref = refs[0]
        if ref.get("kind") == names.ENDPOINT_KIND and str(ref.get("apiVersion", "")).startswith(
            _API_GROUP
        ):
            return HeldName(kind, name, str(ref.get("name")), str(ref.get("uid") or ""))
        return HeldName(kind, name, None, owner=f"{ref.get('kind')} {ref.get('name')}")
    labels = meta.get("labels") or {}
    endpoint = labels.get(names.LABEL_ENDPOINT)
    if labels.get(names.LABEL_MANAGED_BY) == names.MANAGER and isinstance(endpoint, str):
        return HeldName(kind, name, endpoint)
    return HeldName(kind, name, None)


def held_names(deployments: Sequence[Obj], services: Sequence[Obj]) -> tuple[HeldName, ...]:
    return tuple(held_name(names.DEPLOYMENT, d) for d in deployments) + tuple(
        held_name(names.SERVICE, s) for s in services
    )


def owned(kind: str, obj: Obj, endpoint: DesiredEndpoint) -> bool:
    return held_name(kind, obj).owned_by(endpoint.name, endpoint.uid)


class _NotOwned(Exception):
    def __init__(self, held: HeldName) -> None:
        super().__init__(held.name)
        self.held = held


async def apply_owned(
    client: kube.KubeClient,
    resource: kube.Resource,
    kind: str,
    body: Obj,
    endpoint: DesiredEndpoint,
    *,
    exact: Sequence[tuple[str, ...]] = (),
) -> bool:
    """``KubeClient.apply`` of the endpoint's ``body`` (create, or merge-patch, ``exact`` paths
    as rendered), unless the object exists and is not the endpoint's: then nothing is written,
    a warning is logged and the result is False."""
    meta = body["metadata"]

    def change(current: Obj) -> Obj:
        held = held_name(kind, current)
        if not held.owned_by(endpoint.name, endpoint.uid):
            raise _NotOwned(held)
        return kube.exact_patch(current, body, exact)

    try:
        await client.update(resource, meta.get("namespace"), meta["name"], change, create=body)
    except _NotOwned as refused:
        conflict = NameConflict(kind, meta["name"], refused.held.holder(endpoint.name))
        log.warning("InferenceEndpoint %s: %s: left alone", endpoint.name, conflict.message())
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
