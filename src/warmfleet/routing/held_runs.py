"""``HeldRuns``: the held blocks of one instance in ``ApproxPrefixIndex`` (routing/index.py), kept
as *runs* so that touching a chain's held run costs one LRU move per run, not one per block.

A run is a piece of a chain, head first, whose blocks sit next to each other in the per-block
LRU order with the deepest the least recent: exactly what touching a chain (deepest block
first) leaves behind. One LRU entry (a run id) stands for all of its blocks. Touching the held
run of a chain walks its runs (a run starts where the previous one ends: a block's hash fixes
its whole prefix), splits the run it ends in (or branches off in) where it leaves it (the rest
keeps its place and id) and moves the runs it touched to the LRU's recent end, deepest first.
Runs split at the chains' branch points, so a shared system prompt and each of its
continuations are a run each and a prompt's held run is a few runs; a touch that walks more
than ``MERGE_RUNS`` (a long conversation's turns) merges them into one.
Eviction cuts the least recent run from its deep end. Every held block is in exactly one run
and has its instance's bit in the shared ``owners`` map (block hash -> instances' bits), which
the match reads; for sequences that are not chains (a hash at two places) the order may differ
from the per-block LRU's, never the membership, the sizes or the owner bits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from warmfleet.routing.pending_tails import agreement

# Run ids, the runs' keys in an instance's LRU: above every block hash (64-bit), so above every
# pending tail's placeholder, keyed by its last hash (routing/pending_tails.py).
RUN_BASE = 1 << 66
# A touch that walked more runs than this merges them into one (a long conversation's turns);
# fewer stay apart, so a shared prefix and its continuations are not re-split at every touch.
MERGE_RUNS = 8


class Run:
    """``blocks[:size]``, head first (eviction shortens ``size``; a split keeps the rest)."""

    __slots__ = ("blocks", "size", "walked")

    def __init__(self, blocks: tuple[int, ...], size: int) -> None:
        self.blocks = blocks
        self.size = size
        self.walked = 0  # the serial of the latest touch that walked it


class HeldRuns:
    """One instance's held blocks as runs in its LRU ``lru`` (shared with its pending tails'
    placeholders, routing/pending_tails.py); ``bit``: the instance's bit in ``owners``."""

    __slots__ = ("bit", "lru", "next_id", "owners", "run_at", "runs", "touches")

    def __init__(self, bit: int, owners: dict[int, int], lru: OrderedDict[int, None]) -> None:
        self.bit = bit
        self.owners = owners
        self.lru = lru
        self.runs: dict[int, Run] = {}
        self.run_at: dict[int, int] = {}  # a run's first hash -> its id
        self.next_id = RUN_BASE
        self.touches = 0

    def _run(self, blocks: tuple[int, ...]) -> int:
        """``blocks`` (held, in no run) as a new run, not yet in the LRU: its id."""
        rid = self.next_id
        self.next_id = rid + 1
        self.runs[rid] = Run(blocks, len(blocks))
        self.run_at[blocks[0]] = rid
        return rid

    def _new(self, blocks: tuple[int, ...]) -> None:
        """``blocks`` (held, in no run) as a new run at the LRU's recent end."""
        self.lru[self._run(blocks)] = None

    def held_run(self, hashes: Sequence[int], guess: int) -> int:
        """Length of the leading run of ``hashes`` held, assuming held blocks form a prefix of
        the chain (callers stay correct when they do not): ``guess`` if it checks out, else
        found by bisection."""
        get, bit = self.owners.get, self.bit
        n = len(hashes)
        if (
            0 <= guess <= n
            and (guess == 0 or get(hashes[guess - 1], 0) & bit)
            and (guess == n or not get(hashes[guess], 0) & bit)
        ):
            return guess
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if get(hashes[mid], 0) & bit:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def add(self, blocks: Sequence[int]) -> int:
        """Hold ``blocks`` (head first) as one new run at the recent end, except those already
        held (only when the sequence is not a chain): how many were added."""
        owners, bit = self.owners, self.bit
        get = owners.get
        kept: list[int] = []
        for h in blocks:
            mask = get(h, 0)
            if not mask & bit:
                owners[h] = mask | bit
                kept.append(h)
        if kept:
            self._new(tuple(kept))
        return len(kept)

    def touch(self, hashes: Sequence[int], n: int) -> None:
        """Touch the held run ``hashes[:n]`` (``n >= 1``): its blocks become the most recent,
        the head last."""
        run_at, runs = self.run_at, self.runs
        rid = run_at.get(hashes[0])
        if rid is None:  # (not a chain) nothing held starts the chain
            return
        run = runs[rid]
        if run.size == n and run.blocks[n - 1] == hashes[n - 1]:  # one run, exactly it
            self.lru.move_to_end(rid)
            return
        first_new = self.next_id
        serial = self.touches = self.touches + 1
        touched: list[int] = []  # the runs touched, head first
        pos = 0
        while True:
            run.walked = serial
            blocks, size = run.blocks, run.size
            common = agreement(blocks, hashes, pos, min(size, n - pos))
            if common < size:  # split: the rest keeps its place (and id) in the LRU
                rest = blocks[common:size]
                run.blocks, run.size = rest, len(rest)
                run_at[rest[0]] = rid
                rid = self._run(blocks[:common])
                runs[rid].walked = serial
            touched.append(rid)
            pos += common
            if pos >= n:
                break
            next_rid = run_at.get(hashes[pos])
            if next_rid is None:  # (not a chain) the rest is not where the chain says
                break
            rid = next_rid
            run = runs[rid]
            if run.walked == serial:  # (not a chain: a hash at two places) walked already
                break
        if len(touched) > MERGE_RUNS:
            self._merge(touched)
            return
        lru = self.lru
        move = lru.move_to_end
        for rid in reversed(touched):  # deepest first: the head ends the most recent
            if rid >= first_new:
                lru[rid] = None
            else:
                move(rid)

    def _merge(self, touched: list[int]) -> None:
        """Replace the runs ``touched`` (head first) by one at the LRU's recent end."""
        runs, run_at, lru = self.runs, self.run_at, self.lru
        merged: list[int] = []
        for rid in touched:
            run = runs.pop(rid)
            merged += run.blocks[: run.size]
            del run_at[run.blocks[0]]
            lru.pop(rid, None)
        self._new(tuple(merged))

    def cut(self, rid: int, excess: int) -> tuple[tuple[int, ...], bool]:
        """Evict up to ``excess`` blocks of run ``rid`` (popped from the LRU's old end), deepest
        first: those blocks (the caller clears their owner bits), and whether some are left
        (the caller puts the run back there)."""
        run = self.runs[rid]
        size = run.size
        count = min(excess, size)
        evicted = run.blocks[size - count : size]
        if count == size:
            del self.runs[rid]
            del self.run_at[run.blocks[0]]
            return evicted, False
        run.size = size - count
        return evicted, True

    def blocks(self) -> Iterator[int]:
        """Every held block, least recently used first."""
        runs = self.runs
        for key in self.lru:
            run = runs.get(key)
            if run is not None:
                yield from reversed(run.blocks[: run.size])
