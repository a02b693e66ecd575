"""Consistent hashing by rendezvous (highest random weight) hashing.

Every (key, instance) pair gets a stable 64-bit weight; a key's owner is the instance with the
highest weight and its *walk* is all instances by decreasing weight. Adding an instance moves only
the keys it now wins (~1/N); removing one moves only the keys it owned; and the spill order of a
key is a key-specific permutation, so the overflow of one hot instance spreads over the others
instead of landing on one ring neighbour. Weights depend only on the key hash and the instance
id, so independent gateway replicas agree without talking.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat

import xxhash

from warmfleet.core.hashing import hash_str
from warmfleet.core.types import InstanceId

_h64 = xxhash.xxh3_64_intdigest
_MASK64 = (1 << 64) - 1


class RendezvousHash:
    """Rendezvous hashing over a set of instance ids (order-insensitive)."""

    def __init__(self, instance_ids: Iterable[InstanceId] = (), seed: int = 0) -> None:
        self._seed = seed
        self._salts: dict[InstanceId, int] = {}
        self.set_instances(instance_ids)

    def set_instances(self, instance_ids: Iterable[InstanceId]) -> None:
        self._salts = {iid: hash_str(iid, self._seed) for iid in instance_ids}

    def add(self, instance_id: InstanceId) -> None:
        self._salts[instance_id] = hash_str(instance_id, self._seed)

    def remove(self, instance_id: InstanceId) -> None:
        self._salts.pop(instance_id, None)

    @property
    def instance_ids(self) -> tuple[InstanceId, ...]:
        return tuple(self._salts)

    def salt(self, instance_id: InstanceId) -> int:
        salt = self._salts.get(instance_id)
        return salt if salt is not None else hash_str(instance_id, self._seed)

    def weight(self, key_hash: int, instance_id: InstanceId) -> int:
        return int(_h64((key_hash & _MASK64).to_bytes(8, "little"), self.salt(instance_id)))

    def _weights(
        self, key_hash: int, among: Sequence[InstanceId] | None
    ) -> list[tuple[int, InstanceId]]:
        ids = among if among is not None else tuple(self._salts)
        data = (key_hash & _MASK64).to_bytes(8, "little")
        try:  # every id known (the usual case): all hashing in C
            salts = list(map(self._salts.__getitem__, ids))
        except KeyError:
            salts = [self.salt(iid) for iid in ids]
        return list(zip(map(_h64, repeat(data), salts), ids, strict=True))

    def owner(self, key_hash: int, among: Sequence[InstanceId] | None = None) -> InstanceId:
        """The highest-weight instance (of ``among`` if given, else of the set)."""
        weights = self._weights(key_hash, among)
        if not weights:
            raise ValueError("no instances")
        return max(weights)[1]

    def walk(self, key_hash: int, among: Sequence[InstanceId] | None = None) -> list[InstanceId]:
        """All instances (of ``among`` if given) by decreasing weight for ``key_hash``."""
        return [iid for _w, iid in sorted(self._weights(key_hash, among), reverse=True)]
