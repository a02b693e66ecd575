"""``ExactPrefixIndex``: which instance holds which chained block hashes, as the engines report
them in KV events (``KvEventSink``); the same ``match`` as ``routing.index.ApproxPrefixIndex``.
Its ``claims`` (``routing.claims``) cover what was routed and not reported yet."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from warmfleet.core.types import InstanceId
from warmfleet.routing.claims import Claims
from warmfleet.routing.index import BitIndex


class ExactPrefixIndex(BitIndex):
    """Engine-reported cache contents (``KvEventSink``); instances without events are unknown."""

    def __init__(self, claim_ttl_s: float = 0.0) -> None:
        super().__init__()
        self._blocks: dict[InstanceId, set[int]] = {}
        self.claims = Claims(claim_ttl_s)
        # Where the chains of the hashes it is fed start (set by the feeder; None: any). A key
        # chained from another start (a tenant, an adapter, another model name) names other
        # hashes for the same tokens: this index cannot speak for it.
        self.chain_seed: int | None = None

    def comparable(self, key_chain_seed: int | None) -> bool:
        return self.chain_seed is None or key_chain_seed == self.chain_seed

    def knows(self, instance_id: InstanceId) -> bool:
        return instance_id in self._blocks

    @property
    def known_instances(self) -> tuple[InstanceId, ...]:
        return tuple(self._blocks)

    @property
    def reporting(self) -> bool:
        """Some instance reports KV events."""
        return bool(self._blocks)

    def overlay(
        self, matches: dict[InstanceId, int], block_hashes: Sequence[int], now_s: float
    ) -> None:
        """Replace the approximate ``matches`` of the instances this index knows by the blocks
        their engines reported, extended by the claims not lapsed at ``now_s``."""
        reported, extend = self.match(block_hashes), self.claims.extend
        for iid in self._blocks:
            blocks = extend(iid, block_hashes, reported.get(iid, 0), now_s)
            if blocks:
                matches[iid] = blocks
            else:
                matches.pop(iid, None)

    def claim(
        self, instance_id: InstanceId, block_hashes: Sequence[int], start: int, now_s: float
    ) -> None:
        """``block_hashes[start:]`` were routed to ``instance_id`` at ``now_s`` (ignored for
        an instance that does not report events). Blocks its engine reported already are not
        claimed: a peer's note (replica sync) can trail the events it would anticipate."""
        blocks = self._blocks.get(instance_id)
        if blocks is None:
            return
        n = len(block_hashes)
        while start < n and block_hashes[start] in blocks:
            start += 1
        self.claims.claim(instance_id, block_hashes, start, now_s)

    def occupancy(self, instance_id: InstanceId) -> int:
        return len(self._blocks.get(instance_id, ()))

    def on_blocks_stored(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None:
        self.claims.drop(instance_id, block_hashes, stored=True)  # the engine's word now
        blocks = self._blocks.setdefault(instance_id, set())
        bit = 1 << self._bit(instance_id)
        owners = self._owners
        for h in block_hashes:
            blocks.add(h)
            owners[h] = owners.get(h, 0) | bit

    def on_blocks_removed(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None:
        blocks = self._blocks.get(instance_id)
        if blocks is None:
            return
        self.claims.drop(instance_id, block_hashes)
        gone = [h for h in block_hashes if h in blocks]
        blocks.difference_update(gone)
        self._drop_bit(self._bit_of[instance_id], gone)

    def on_instance_cleared(self, instance_id: InstanceId) -> None:
        self.claims.forget(instance_id)
        blocks = self._blocks.get(instance_id)
        if blocks is None:
            self._blocks[instance_id] = set()
            self._bit(instance_id)
            return
        self._drop_bit(self._bit_of[instance_id], blocks)
        blocks.clear()

    def remove_instance(self, instance_id: InstanceId) -> None:
        self.claims.forget(instance_id)
        blocks = self._blocks.pop(instance_id, None)
        self._release(instance_id, blocks or ())

    def retain(self, instance_ids: Iterable[InstanceId]) -> None:
        keep = set(instance_ids)
        for iid in [i for i in self._blocks if i not in keep]:
            self.remove_instance(iid)
