"""Warm-node placement: prefer nodes holding the weights (then the image), fall back anywhere.

The Kubernetes backend expresses the preference as preferred node affinity on the readiness
labels (the scheduler decides); a backend that places replicas itself (the embedded fleet, the
what-if simulator) calls ``choose_nodes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warmfleet.api.names import READY_VALUE, image_label, weights_label
from warmfleet.control.actions import NodeAffinityPreference
from warmfleet.control.observed import ObservedNode

WEIGHTS_PREFERENCE = 100
IMAGE_PREFERENCE = 20


def preferences(
    model_cache: str | None, image_cache: str | None
) -> tuple[NodeAffinityPreference, ...]:
    prefs: list[NodeAffinityPreference] = []
    if model_cache is not None:
        prefs.append(NodeAffinityPreference(weights_label(model_cache), WEIGHTS_PREFERENCE))
    if image_cache is not None:
        prefs.append(NodeAffinityPreference(image_label(image_cache), IMAGE_PREFERENCE))
    return tuple(prefs)


def node_score(labels: Mapping[str, str], prefs: Sequence[NodeAffinityPreference]) -> int:
    return sum(p.weight for p in prefs if labels.get(p.label) == READY_VALUE)


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    prepared: bool  # the node carries the weights-ready label (or no weights cache is used)


def choose_nodes(
    count: int,
    nodes: Sequence[ObservedNode],
    prefs: Sequence[NodeAffinityPreference],
    replicas_per_node: Mapping[str, int],
    *,
    node_selector: Mapping[str, str] | None = None,
    max_per_node: int = 1,
) -> list[Placement]:
    """Pick nodes for ``count`` new replicas: highest preference score first, then least loaded,
    then by name (deterministic). Nodes that are not ready, do not match the selector or are
    full are skipped; fewer placements than ``count`` are returned when the fleet is full."""
    weights_pref = next((p for p in prefs if p.label.startswith("weights.")), None)
    load = dict(replicas_per_node)
    chosen: list[Placement] = []
    for _ in range(count):
        candidates = [
            n
            for n in nodes
            if n.ready and n.matches(node_selector or {}) and load.get(n.name, 0) < max_per_node
        ]
        if not candidates:
            break
        best = min(
            candidates, key=lambda n: (-node_score(n.labels, prefs), load.get(n.name, 0), n.name)
        )
        load[best.name] = load.get(best.name, 0) + 1
        prepared = weights_pref is None or best.labels.get(weights_pref.label) == READY_VALUE
        chosen.append(Placement(best.name, prepared))
    return chosen


def unprepared_share(prepared_flags: Sequence[bool]) -> float:
    """Share of replicas that started on a node without the weights (0.0 when none)."""
    if not prepared_flags:
        return 0.0
    return sum(1 for p in prepared_flags if not p) / len(prepared_flags)
