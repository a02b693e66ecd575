"""A capture's placements, for the simulator to replay (pure; ``warmfleet doctor``, docs/doctor.md
"The captured strategy's replay").

A capture records the ``instance`` each request went to live. Replaying those placements (the
simulator's ``placements``) sends each request to the same instance again, so a replay of the
captured strategy measures the cache and engine model against what happened, not against
another draw of the strategy's choices (a ``random`` capture replayed with fresh random choices
differs from the live run by the sampling noise of two draws).

Captured names map to the simulator's instances (``i0``, ``i1``, ... in creation order):
the instances there from the start (first seen within ``PRESENT_AT_START_S`` of the trace's
start), in order of first appearance, to ``i0`` .. ``i<instances-1>``; those that joined later,
in order of joining, to the instances the replay adds at each join (``doctor_run.
replay_scenario``), ``i<instances>`` on. A request has no placement (its strategy chooses) when
its record names no instance, or an instance beyond the replayed fleet (a replay on fewer
instances than were captured).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from warmfleet.api.trace_format import TraceRecord
from warmfleet.core.types import InstanceId
from warmfleet.sim.workloads.base import WorkloadRequest


def instance_names(
    records: Sequence[TraceRecord], instances: int, joins: Mapping[str, float]
) -> dict[str, InstanceId]:
    """Captured instance name -> simulator instance id (see the module docstring); ``joins``:
    the instances that joined during the trace (``doctor.Churn.joins``: name -> when)."""
    first_seen: dict[str, float] = {}
    for record in records:
        name = record.instance
        if name is not None and name not in joins:
            seen = first_seen.get(name)
            if seen is None or record.timestamp < seen:
                first_seen[name] = record.timestamp
    present = sorted(first_seen, key=lambda name: (first_seen[name], name))[:instances]
    out = {name: f"i{n}" for n, name in enumerate(present)}
    joined = sorted(joins, key=lambda name: (joins[name], name))
    out.update({name: f"i{instances + n}" for n, name in enumerate(joined)})
    return out


def captured_placements(
    records: Sequence[TraceRecord],
    requests: Sequence[WorkloadRequest],
    instances: int,
    joins: Mapping[str, float],
) -> dict[int, InstanceId] | None:
    """Each placed request's simulator instance, by its index in ``requests`` (built from
    ``records``: ``request_id`` is the record's index); None when no record names an instance
    (then nothing is replayed by placement)."""
    names = instance_names(records, instances, joins)
    if not names:
        return None
    out: dict[int, InstanceId] = {}
    for index, req in enumerate(requests):
        placed = names.get(records[req.request_id].instance or "")
        if placed is not None:
            out[index] = placed
    return out
