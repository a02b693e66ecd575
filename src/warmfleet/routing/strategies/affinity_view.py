"""What ``prefix_affinity`` reads per snapshot (``Columns``) and per decision (``View``), and
its prefill cost model (``prefill_work``).

Plain slots classes with their own ``__init__``: one of each may be built for every request,
and compiled they build in ~20 ns (a dataclass's generated ``__init__`` stays interpreted,
docs/compiled.md). Neither is modified after it is built.
"""

from __future__ import annotations

from warmfleet.core.types import InstanceId, InstanceState

# Above this many instances changed since the last snapshot, their columns are all read again.
REREAD_POSITIONS = 8


class Columns:
    """What the strategy reads from one snapshot's instances, in snapshot order."""

    __slots__ = ("counts", "ids", "pos", "tokens")

    def __init__(
        self,
        ids: tuple[InstanceId, ...],
        pos: dict[InstanceId, int],
        tokens: tuple[int, ...],
        counts: tuple[int, ...],
    ) -> None:
        self.ids = ids
        self.pos = pos
        self.tokens = tokens
        self.counts = counts

    def reread(
        self, caps: tuple[int, ...], instances: tuple[InstanceState, ...], changed: list[int]
    ) -> Columns | None:
        """These columns with the load of the instances at ``changed`` read again (``caps``:
        the capacities they were read with); ``None`` when one of them is another instance or
        has another capacity (the fleet's order or capacities moved: read them all)."""
        if not changed:
            return self
        ids = self.ids
        tokens, counts = list(self.tokens), list(self.counts)
        for i in changed:
            state = instances[i]
            if state.instance_id != ids[i] or state.kv_capacity_blocks != caps[i]:
                return None
            tokens[i] = state.in_flight_tokens
            counts[i] = state.in_flight_requests
        return Columns(ids, self.pos, tuple(tokens), tuple(counts))


class View:
    """One decision's view of the fleet: per instance (in ``ids`` order) its load, and the
    blocks it is predicted to hold (``matches``, only instances holding some)."""

    __slots__ = (
        "best_blocks", "cap_load", "ids", "loads", "matches", "pos", "tokens_per_block", "work",
    )  # fmt: skip

    def __init__(
        self,
        *,
        ids: tuple[InstanceId, ...],
        loads: list[int],
        pos: dict[InstanceId, int],
        matches: dict[InstanceId, int],
        best_blocks: int,
        work: int,
        cap_load: float,
        tokens_per_block: float,
    ) -> None:
        self.ids = ids
        self.loads = loads
        self.pos = pos
        self.matches = matches
        self.best_blocks = best_blocks
        self.work = work
        self.cap_load = cap_load
        self.tokens_per_block = tokens_per_block


def prefill_work(
    uncached_tokens: float, context_tokens: float, linear: float, attention: float
) -> float:
    """Predicted prefill work (token-equivalents) of ``uncached_tokens`` at the end of a prompt of
    ``context_tokens``: linear layers cost ``linear`` per token; attention costs ``attention``
    per (token, context token), each new token attending on average to the cached part plus
    half of the new part."""
    if uncached_tokens <= 0:
        return 0.0
    mean_context = context_tokens - uncached_tokens / 2.0
    return uncached_tokens * (linear + attention * mean_context)
