# ruff: noqa: ARG002  (strategies implement the full Strategy protocol)
"""Load-only strategies: random (the default), round robin, least outstanding, power of two."""

from __future__ import annotations

import random
from collections.abc import Sequence

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey


class RandomStrategy:
    name = "random"
    reads_block_hashes = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        instances = fleet.instances
        return Decision(instances[self._rng.randrange(len(instances))].instance_id, Reason.RANDOM)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        return None

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        return None


class RoundRobinStrategy:
    """Cycles through the fleet in snapshot order; the cursor advances on ``on_routed``."""

    name = "round_robin"
    reads_block_hashes = False

    def __init__(self) -> None:
        self._cursor = 0

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        instances = fleet.instances
        return Decision(instances[self._cursor % len(instances)].instance_id, Reason.ROUND_ROBIN)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self._cursor += 1

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        return None


class LeastOutstandingStrategy:
    """Fewest in-flight requests; ties broken at random (like SageMaker's LOR)."""

    name = "least_outstanding_requests"
    reads_block_hashes = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        instances = fleet.instances
        low = min(s.in_flight_requests for s in instances)
        ties = [s.instance_id for s in instances if s.in_flight_requests == low]
        chosen = ties[0] if len(ties) == 1 else ties[self._rng.randrange(len(ties))]
        return Decision(chosen, Reason.LOAD_BALANCE)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        return None

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        return None


class PowerOfTwoStrategy:
    """Two distinct instances at random; the one with fewer in-flight requests wins."""

    name = "power_of_two"
    reads_block_hashes = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        instances = fleet.instances
        if len(instances) == 1:
            return Decision(instances[0].instance_id, Reason.LOAD_BALANCE)
        a, b = self._rng.sample(range(len(instances)), 2)
        first, second = instances[a], instances[b]
        chosen = second if second.in_flight_requests < first.in_flight_requests else first
        return Decision(chosen.instance_id, Reason.LOAD_BALANCE)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        return None

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        return None
