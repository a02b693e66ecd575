"""``PendingTails``: the new tails of routed chains that ``ApproxPrefixIndex`` keeps whole, for
one instance (routing/index.py, ``ApproxPrefixIndex``).

A pending tail is a tuple of chained block hashes, keyed by its first hash (where a later chain
finds it: right after the instance's held run) and by its last (its placeholder's key in the
instance's LRU: block hashes are 64-bit, ``-2**64 < h < 2**64``, and the LRU's other keys are
run ids, ``held_runs.RUN_BASE`` and above). Under the chain property (a block's hash fixes its
whole prefix) no two tails share a first or a last hash; a sequence that breaks it (a hash at
two places) is refused by ``add`` and then kept as a run by the index.
"""

from __future__ import annotations

from collections.abc import Sequence


def agreement(blocks: tuple[int, ...], hashes: Sequence[int], at: int, m: int) -> int:
    """How many leading blocks of ``blocks`` equal ``hashes[at:]`` among the first ``m``
    (``blocks[0] == hashes[at]``, ``m >= 1``). Chained blocks agree up to a point and no
    further: bisection."""
    if blocks[m - 1] == hashes[at + m - 1]:
        return m
    lo, hi = 1, m - 1  # blocks[0] agrees, blocks[m - 1] does not
    while lo < hi:
        mid = (lo + hi) >> 1
        if blocks[mid] == hashes[at + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class PendingTails:
    """One instance's pending tails (``by_first``: first hash -> tail). ``starts`` is shared by
    every instance of an index: first hash -> the bits of the instances a tail of which starts
    there (``bit`` is this instance's), so a match looks a position up once for all of them."""

    __slots__ = ("bit", "by_first", "first_of_last", "starts")

    def __init__(self, bit: int, starts: dict[int, int]) -> None:
        self.bit = bit
        self.starts = starts
        self.by_first: dict[int, tuple[int, ...]] = {}
        self.first_of_last: dict[int, int] = {}

    def _key(self, tail: tuple[int, ...]) -> None:
        first = tail[0]
        self.by_first[first] = tail
        self.starts[first] = self.starts.get(first, 0) | self.bit

    def _unkey(self, first: int) -> tuple[int, ...]:
        tail = self.by_first.pop(first)
        left = self.starts[first] & ~self.bit
        if left:
            self.starts[first] = left
        else:
            del self.starts[first]
        return tail

    def clear(self) -> None:
        """Forget every tail (the instance is gone)."""
        for first in list(self.by_first):
            self._unkey(first)
        self.first_of_last.clear()

    def follow(self, hashes: Sequence[int], at: int) -> int:
        """How many blocks of ``hashes`` from ``at`` on a pending tail holds (0: none starts
        there). Blocks are chained, so the tail and the chain agree up to a point and no
        further: bisection."""
        tail = self.by_first.get(hashes[at])
        if tail is None:
            return 0
        return agreement(tail, hashes, at, min(len(tail), len(hashes) - at))

    def add(self, tail: tuple[int, ...]) -> bool:
        """Keep ``tail`` pending; False (nothing kept) if a tail already starts or ends with
        one of its ends."""
        first, last = tail[0], tail[-1]
        if first in self.by_first or last in self.first_of_last:
            return False
        self._key(tail)
        self.first_of_last[last] = first
        return True

    def take(self, first: int, count: int) -> tuple[tuple[int, ...], int, int | None]:
        """Take the first ``count`` blocks of the tail that starts with ``first`` (a chain ran
        into them): those blocks; how many more blocks were dropped with them (a remainder
        that could not be keyed); the last hash of a tail that is gone (its placeholder must
        go), else None."""
        tail = self._unkey(first)
        taken, rest = tail[:count], tail[count:]
        last = tail[-1]
        if rest and rest[0] not in self.by_first:
            self._key(rest)
            self.first_of_last[last] = rest[0]
            return taken, 0, None
        del self.first_of_last[last]
        return taken, len(rest), last

    def cut(self, last: int, excess: int) -> tuple[int, int | None]:
        """Evict up to ``excess`` blocks from the tail whose last hash is ``last``, deepest
        first: how many went, and the new last hash of what is left (None: the whole tail)."""
        first = self.first_of_last.pop(last)
        tail = self.by_first[first]
        n = len(tail)
        if n <= excess or tail[n - excess - 1] in self.first_of_last:
            self._unkey(first)
            return n, None
        kept = tail[: n - excess]  # starts where it started: its first hash's keys stay
        self.by_first[first] = kept
        self.first_of_last[kept[-1]] = first
        return excess, kept[-1]
