"""``WorkLedger``: the predicted in-flight *work* per instance.

Work is the uncached prompt tokens plus the expected output tokens of the requests routed to an
instance, reconciled against the caller's in-flight counts at every decision.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from operator import sub

from warmfleet.core.types import InstanceId, InstanceState

_LEDGER_ENTRIES = 4096  # per instance: a caller that never reports completions cannot grow it
_INCREMENTAL_POSITIONS = 8  # above this many changed positions, recompute all loads in C


class WorkLedger:
    """Predicted in-flight work per instance: what each routed request adds to its engine.

    A request's *work* is its predicted uncached prompt tokens plus its expected output tokens
    (a cache hit costs its engine a fraction of its size, while the caller's
    ``in_flight_tokens`` counts its whole prompt). A strategy learns only routings, so the
    ledger is reconciled against the caller's counts at every decision: when an instance
    reports fewer in-flight requests than the ledger holds, the finished ones are dropped (the
    entry whose tokens equal the caller's drop when exactly one finished; else, oldest first,
    entries that fit the drop; then the oldest). In-flight tokens the ledger does not know
    (another gateway replica, a restart, a mismatch) count in full, so the estimate errs
    towards "busy". Sums and loads are kept per fleet position and updated only where an
    instance was routed to or its caller counts changed, so a decision costs O(changes).
    """

    def __init__(self, incremental: bool = True) -> None:
        """``incremental=False`` recomputes every position's load at every call (the reference
        the incremental update is tested against)."""
        self._incremental = incremental
        self._entries: dict[InstanceId, deque[tuple[int, int]]] = {}
        self._ids: list[InstanceId] = []
        self._pos: dict[InstanceId, int] = {}
        self._count: list[int] = []
        self._tokens: list[int] = []
        self._work: list[int] = []
        # positions to reconcile at the next decision (added to since), last caller counts
        self._dirty: set[int] = set()
        self._last_tokens: Sequence[int] = ()
        # loads of the last token-mode call, kept up to date at the positions that change
        self._loads: list[int] | None = None

    def set_order(self, instance_ids: Sequence[InstanceId]) -> None:
        """The snapshots' instance order. An instance missing from it (a retry's snapshot
        leaves out the instance that failed) keeps its entries until ``retain`` drops it."""
        self._ids = list(instance_ids)
        self._pos = {iid: i for i, iid in enumerate(self._ids)}
        self._count = [0] * len(self._ids)
        self._tokens = [0] * len(self._ids)
        self._work = [0] * len(self._ids)
        self._dirty = set(range(len(self._ids)))
        self._last_tokens = ()
        self._loads = None
        for iid, entries in self._entries.items():
            pos = self._pos.get(iid)
            if pos is None:
                continue
            self._count[pos] = len(entries)
            self._tokens[pos] = sum(e[0] for e in entries)
            self._work[pos] = sum(e[1] for e in entries)

    def retain(self, instance_ids: Iterable[InstanceId]) -> None:
        """The fleet's instances are now ``instance_ids``: forget the others' entries."""
        keep = set(instance_ids)
        for iid in [i for i in self._entries if i not in keep]:
            del self._entries[iid]

    def add(self, instance_id: InstanceId, tokens: int, work: int) -> None:
        pos = self._pos.get(instance_id)
        if pos is None:  # not in the fleet order (yet): nothing to reconcile it against
            return
        entries = self._entries.get(instance_id)
        if entries is None:
            entries = self._entries[instance_id] = deque()
        entries.append((tokens, work))
        self._dirty.add(pos)
        self._count[pos] += 1
        self._tokens[pos] += tokens
        self._work[pos] += work
        if len(entries) > _LEDGER_ENTRIES:
            self._drop(pos, entries.popleft())

    def _drop(self, pos: int, entry: tuple[int, int]) -> None:
        self._count[pos] -= 1
        self._tokens[pos] -= entry[0]
        self._work[pos] -= entry[1]

    def loads(
        self,
        instances: Sequence[InstanceState],
        tokens: Sequence[int],
        requests_only_work: int,
        counts: Sequence[int] | None = None,
    ) -> list[int]:
        """Estimated in-flight work per instance (reconciles first; idempotent per snapshot).

        ``instances`` in ``set_order`` order; ``tokens``: their ``in_flight_tokens``;
        ``counts``: their ``in_flight_requests`` (taken from ``instances`` when omitted).
        ``requests_only_work``: the work assumed per unknown request when the caller tracks
        request counts only (all tokens 0). The returned list is the ledger's own (updated in
        place at the positions that changed): read it, do not modify it.
        """
        if counts is None:
            counts = [s.in_flight_requests for s in instances]
        if not any(tokens):
            return self._loads_from_counts(counts, requests_only_work)
        # only positions routed to, or whose caller tokens changed, can hold finished entries
        candidates = self._dirty
        last = self._last_tokens
        if tokens is not last and tokens != last:
            if len(last) == len(tokens):
                candidates.update(
                    [i for i, (t, q) in enumerate(zip(tokens, last, strict=True)) if t != q]
                )
            else:
                candidates.update(range(len(tokens)))
            self._last_tokens = tokens
        known = self._count
        for pos in candidates:
            count = counts[pos]
            if known[pos] > count:
                self._reconcile(pos, count, tokens[pos])
        loads = self._loads
        if loads is None or not self._incremental or len(candidates) > _INCREMENTAL_POSITIONS:
            # work + max(0, tokens - known tokens) == max(work, tokens - (known tokens - work)),
            # two passes in C; the discount is the cached prompt tokens of the known requests
            discount = list(map(sub, self._tokens, self._work))
            loads = self._loads = list(map(max, self._work, map(sub, tokens, discount)))
        else:  # the same formula, at the few positions that can have changed
            work, known_tokens = self._work, self._tokens
            for pos in candidates:
                loads[pos] = max(work[pos], tokens[pos] - (known_tokens[pos] - work[pos]))
        candidates.clear()
        return loads

    def _loads_from_counts(self, requests: Sequence[int], requests_only_work: int) -> list[int]:
        self._loads = None  # the token-mode cache does not follow count-only decisions
        for pos, (known, count) in enumerate(zip(self._count, requests, strict=True)):
            if known > count:
                self._reconcile(pos, count, 0)
        self._dirty.clear()
        return [
            w + (r - k) * requests_only_work if r > k else w
            for w, r, k in zip(self._work, requests, self._count, strict=True)
        ]

    def _reconcile(self, pos: int, count: int, tokens: int) -> None:
        entries = self._entries[self._ids[pos]]
        need = len(entries) - count
        gone = self._tokens[pos] - tokens  # tokens the caller no longer counts
        if need == 1:
            for entry in entries:
                if entry[0] == gone:
                    entries.remove(entry)
                    self._drop(pos, entry)
                    return
        else:  # several finished: oldest first among those that fit the caller's drop
            for entry in [e for e in entries if e[0] <= gone]:
                if need == 0 or entry[0] > gone:
                    continue
                entries.remove(entry)
                self._drop(pos, entry)
                gone -= entry[0]
                need -= 1
        while len(entries) > count:
            self._drop(pos, entries.popleft())
