"""The live gateway's side of a ``ReplicaView``: the variant's router of the moment
(``CurrentRouter``), the strategy of a view whose variant was removed (``Detached``) and the
restart-on-bug wrapper of the sync's tasks (``kept``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, RoutingKey
from warmfleet.gateway.variant import VariantRuntime

log = logging.getLogger(__name__)


async def kept(name: str, step: Callable[[], Awaitable[None]]) -> None:
    """Run ``step`` to its end; a bug in it is logged and it starts again a second later
    (one failing part must not take the others, and the replica's sync, down)."""
    while True:
        try:
            await step()
            return
        except Exception:
            log.exception("replica sync: %s failed; restarting it in 1 s", name)
            await asyncio.sleep(1.0)


class CurrentRouter:
    """A ``ReplicaView``'s strategy in the live gateway: the variant's router of the moment (a
    reload or the admin API may replace it; what it learnt is adopted by the new one)."""

    name = "gateway-router"
    reads_block_hashes = True

    def __init__(self, variant: VariantRuntime) -> None:
        self.variant = variant

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        return self.variant.router.choose(key, fleet)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.variant.router.on_routed(key, decision)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.variant.router.on_instances_changed(instance_ids)


class Detached:
    """The strategy of a view whose variant a reload removed: it learns nothing (the variant's
    router and index are let go). The view itself stays: its sequence numbers go on if the
    variant comes back, and its peers' notes are still counted so that their ends balance."""

    name = "detached"
    reads_block_hashes = False

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:  # noqa: ARG002
        raise RuntimeError("a detached replica view routes nothing")

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        pass

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        pass
