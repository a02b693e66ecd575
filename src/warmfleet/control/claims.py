"""Which endpoint a contested object name belongs to (pure).

Names derived from an endpoint's and its variants' names can collide across endpoints
(``names.derived_names``). The rules, those of a Kubernetes controller:
- an existing object belongs to whoever holds it: no other endpoint updates, adopts or deletes
  it (an object warmfleet does not manage is held by nobody it could give it to);
- a name nobody holds yet goes to the first live endpoint, by name, that needs it (the order
  the plan creates things in);
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
    made for), then what the backend reports besides (it knows more: controllers' uids)."""
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
        for key in names.derived_names(endpoint.name, endpoint.spec):
            if key[0] not in observed.named_kinds:
                continue
            holder = held.get(key)
            if holder is not None:
                if not holder.owned_by(endpoint.name, endpoint.uid):
                    found.append(NameConflict(*key, holder.holder(endpoint.name)))
            elif first.setdefault(key, endpoint.name) != endpoint.name:
                found.append(NameConflict(*key, f"InferenceEndpoint {first[key]}"))
        if found:
            result[endpoint.name] = tuple(found)
    return result


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
