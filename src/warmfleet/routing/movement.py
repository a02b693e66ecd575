"""How many prefixes change instance when the fleet changes (consistent-hashing quality)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from warmfleet.core.types import FleetSnapshot, InstanceId, InstanceState, RoutingKey
from warmfleet.routing.base import Strategy


def _idle_fleet(ids: Sequence[InstanceId], capacity_blocks: int) -> FleetSnapshot:
    return FleetSnapshot(
        tuple(InstanceState(iid, kv_capacity_blocks=capacity_blocks) for iid in ids)
    )


def moved_fraction(
    strategy_factory: Callable[[], Strategy],
    keys: Sequence[RoutingKey],
    before_ids: Sequence[InstanceId],
    after_ids: Sequence[InstanceId],
) -> float:
    """Route every key on the idle ``before_ids`` fleet (learning each decision), switch to
    ``after_ids``, re-choose every key on the idle new fleet.

    Instances report room for every key's blocks, so this measures placement stability, not
    eviction. Returns the fraction of keys whose instance changed."""
    if not keys:
        return 0.0
    strategy = strategy_factory()
    room = sum(len(key.block_hashes) for key in keys) + 1
    before = _idle_fleet(before_ids, room)
    strategy.on_instances_changed(list(before_ids))
    first: list[InstanceId] = []
    for key in keys:
        decision = strategy.choose(key, before)
        strategy.on_routed(key, decision)
        first.append(decision.instance_id)
    strategy.on_instances_changed(list(after_ids))
    after = _idle_fleet(after_ids, room)
    moved = sum(
        1
        for key, old in zip(keys, first, strict=True)
        if strategy.choose(key, after).instance_id != old
    )
    return moved / len(keys)
