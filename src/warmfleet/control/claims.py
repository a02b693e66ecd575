"""Which endpoint a contested object name belongs to (pure).

Names derived from an endpoint's and its variants' names can collide across endpoints
(``names.derived_names``), and anyone may create an object of a name an endpoint derives (its
weights cache's too: a user's own ModelCache, an earlier endpoint's of the same name; its image
cache's: a user's own ImageCache, or a DaemonSet of its puller's name). The rules, those of a
Kubernetes controller:
- an existing object belongs to whoever holds it: no other endpoint updates, adopts or deletes
  it (an object warmfleet does not manage is held by nobody it could give it to);
- a name nobody holds yet goes to the first live endpoint, by name, that needs it (the order
  the plan creates things in), except an ImageCache's and its puller's: warmfleet's are shared
  by every endpoint that pulls that image onto those nodes (``SHARED``), only one warmfleet
  does not manage is held elsewhere (then the image is not pulled for it);
- the others get a ``NameConflict`` condition naming the object and its holder, and get the
  name once it is free (level-triggered: recomputed every pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmfleet.api import names
from warmfleet.api.resources import Condition
from warmfleet.control.observed import DesiredEndpoint, HeldName, ObservedState

CONDITION = "NameConflict"
REASON = "NameHeldElsewhere"
MODEL_CACHE = "ModelCache"
IMAGE_CACHE = "ImageCache"
PULLER = names.DAEMONSET  # an ImageCache's puller
SHARED = frozenset({IMAGE_CACHE, PULLER})  # kinds whose objects warmfleet shares among endpoints


@dataclass(frozen=True, slots=True)
class NameConflict:
    """An object ``kind``/``name`` the endpoint needs that belongs to ``holder`` (for people;
    empty: to no owner, it exists and warmfleet does not manage it)."""

    kind: str
    name: str
    holder: str

    def message(self) -> str:
        if not self.holder:
            return f"{self.kind} {self.name} exists and is not managed by warmfleet"
        return f"{self.kind} {self.name} belongs to {self.holder}"


Conflicts = dict[str, tuple[NameConflict, ...]]  # endpoint name -> its conflicts


def holders(observed: ObservedState) -> dict[tuple[str, str], HeldName]:
    """(kind, name) -> its holder: the observed Deployments (held by the endpoint they were
    made for), then what the backend reports besides (it knows more: controllers' uids; of a
    ``SHARED`` kind, only the objects warmfleet does not manage)."""
    found = {
        (names.DEPLOYMENT, d.name): HeldName(names.DEPLOYMENT, d.name, d.endpoint)
        for d in observed.deployments
    }
    found.update({(h.kind, h.name): h for h in observed.held})
    return found


def name_conflicts(endpoints: Sequence[DesiredEndpoint], observed: ObservedState) -> Conflicts:
    """The names each live endpoint needs but may not have (none: not in the result)."""
    held = holders(observed)
    first: dict[tuple[str, str], str] = {}
    result: Conflicts = {}
    for endpoint in sorted((e for e in endpoints if not e.deleting), key=lambda e: e.name):
        found = []
        for key in needed_names(endpoint):
            if key[0] not in observed.named_kinds:
                continue
            holder = held.get(key)
            if holder is not None:
                if not holder.owned_by(endpoint.name, endpoint.uid):
                    found.append(NameConflict(*key, holder.holder(endpoint.name)))
            elif key[0] not in SHARED and first.setdefault(key, endpoint.name) != endpoint.name:
                found.append(NameConflict(*key, f"InferenceEndpoint {first[key]}"))
        if found:
            result[endpoint.name] = tuple(found)
    return result


def needed_names(endpoint: DesiredEndpoint) -> list[tuple[str, str]]:
    """(kind, name) of the objects the endpoint's current revision needs that another holder
    may have: ``names.derived_names`` and, when it caches them, its ModelCache, and its
    ImageCache and that cache's puller DaemonSet."""
    spec = endpoint.spec
    found = names.derived_names(endpoint.name, spec)
    if spec.model_cache_config.weights_cache.enabled:
        found.append((MODEL_CACHE, names.model_cache_name(endpoint.name, spec)))
    if spec.model_cache_config.image_cache.enabled:
        image = names.image_cache_name(spec.image, spec.node_selector)
        found += [(IMAGE_CACHE, image), (PULLER, names.puller_name(image))]
    return found


def foreign(observed: ObservedState, kind: str) -> frozenset[str]:
    """The names of the observed objects of ``kind`` that no endpoint holds (made by someone
    else: warmfleet neither writes nor deletes them). Empty when the backend does not say who
    holds that kind (``named_kinds``)."""
    if kind not in observed.named_kinds:
        return frozenset()
    return frozenset(h.name for h in observed.held if h.kind == kind and h.endpoint is None)


def blocked(conflicts: Sequence[NameConflict], kind: str) -> frozenset[str]:
    """The names of ``kind`` the endpoint must leave alone."""
    return frozenset(c.name for c in conflicts if c.kind == kind)


def conflict_condition(conflicts: Sequence[NameConflict]) -> Condition | None:
    """The endpoint's ``NameConflict`` condition (None: it has every name it needs)."""
    if not conflicts:
        return None
    message = "; ".join(c.message() for c in conflicts)
    return Condition(
        type=CONDITION, status="True", reason=REASON, message=f"{message} (left alone until free)"
    )
