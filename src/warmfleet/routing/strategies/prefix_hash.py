# ruff: noqa: ARG002  (strategies implement the full Strategy protocol)
"""AWS ``PREFIX_AWARE`` parity: consistent hash of the first ``prefix_length`` units + tenant.

The owner of ``key.prefix_hash`` (rendezvous hashing) gets the request unless it holds
``concurrency_threshold`` in-flight requests; then the request spills, deterministically, to the
next instance in the key's hash order that is under the threshold (so the spill target warms up
too); if every instance is at the threshold, to the one with the fewest in-flight requests (the
first of them in the key's hash order).
"""

from __future__ import annotations

from collections.abc import Sequence

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.routing.config import PrefixHashConfig
from warmfleet.routing.ring import RendezvousHash


class PrefixHashStrategy:
    name = "prefix_hash"
    reads_block_hashes = False  # only key.prefix_hash

    def __init__(self, config: PrefixHashConfig) -> None:
        self.config = config
        self._ring = RendezvousHash()

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        threshold = self.config.concurrency_threshold
        by_id = {s.instance_id: s for s in fleet.instances}
        owner = self._ring.owner(key.prefix_hash, tuple(by_id))
        if by_id[owner].in_flight_requests < threshold:
            return Decision(owner, Reason.HASH)
        order = self._ring.walk(key.prefix_hash, tuple(by_id))
        for iid in order:
            if by_id[iid].in_flight_requests < threshold:
                return Decision(iid, Reason.OVERFLOW, spilled=True)
        # Ties go to the first in the key's hash order, not in the snapshot's (which sent every
        # tie of every prefix to the same instance).
        least = min(order, key=lambda iid: by_id[iid].in_flight_requests)
        return Decision(least, Reason.LOAD_BALANCE, spilled=True)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        return None

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self._ring.set_instances(instance_ids)
