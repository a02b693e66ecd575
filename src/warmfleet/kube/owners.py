"""Who controls a Kubernetes object: its controller ``ownerReference`` (pure: no I/O).

The operator makes each InferenceEndpoint variant's Service with a controller reference to the
endpoint (``apiVersion: warmfleet.dev/...``, ``kind: InferenceEndpoint``, its ``uid``). Two
endpoints can derive the same Service name (endpoint ``chat`` variant ``prod``, endpoint
``chat-prod``): the operator leaves the name to its holder, so the gateway follows a derived
variant's Service only while ``endpoint_service_problem`` finds nothing to say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warmfleet.api.names import ENDPOINT_KIND
from warmfleet.api.resources import API_GROUP

# How the apiVersion of a reference to a warmfleet object starts (any version of the group).
WARMFLEET_API_VERSION_PREFIX = API_GROUP + "/"


def controller_reference(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller ``ownerReference``: the first with ``controller: true`` (Kubernetes
    allows one; ``None``: it has none)."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def is_endpoint_reference(ref: Mapping[str, Any]) -> bool:
    """Whether the ``ownerReference`` ``ref`` names an InferenceEndpoint (of any version)."""
    api_version = str(ref.get("apiVersion", ""))
    return ref.get("kind") == ENDPOINT_KIND and api_version.startswith(WARMFLEET_API_VERSION_PREFIX)


def endpoint_service_problem(service: Mapping[str, Any] | None, name: str, uid: str) -> str | None:
    """Why Service ``name`` (``service``: the object, ``None`` if there is none) is not the one
    the InferenceEndpoint of ``uid`` controls; ``None``: it is."""
    if service is None:
        return f"Service {name} does not exist"
    ref = controller_reference(service)
    if ref is None:
        return f"Service {name} has no controller (not made by the operator for this endpoint)"
    kind, ref_uid = ref.get("kind"), ref.get("uid")
    if is_endpoint_reference(ref):
        if ref_uid == uid:
            return None
        return (
            f"Service {name} belongs to InferenceEndpoint {ref.get('name')} (uid {ref_uid}),"
            f" not to uid {uid}: a name conflict (see the endpoints' NameConflict condition)"
        )
    return f"Service {name} is controlled by {kind} {ref.get('name')}, not an InferenceEndpoint"
