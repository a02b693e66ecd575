"""``prefix_affinity``: warmfleet's flagship strategy (docs/routing.md explains every step).

Per request:

1. Longest-prefix match of the key's chained blocks against the approximate index (per-instance
   LRU mirroring KV capacity), overridden per instance by the exact index for instances that
   report engine KV events.
2. Bounded load: an instance is *eligible* if its in-flight tokens are at most
   ``max((1 + epsilon) x mean, load_floor_requests x work)``, the mean counting this request.
   The least-loaded instance is always eligible; no fleet-wide gate ever switches affinity off.
3. Cost of an eligible instance = predicted prefill work for its uncached part
   + ``load_weight`` x its in-flight tokens.
4. A *strong* match covers ``min_match_fraction`` of the prompt or ends at a private prefix
   (fewer than ``shared_prefix_fanout`` continuations seen). Cheapest eligible strong holder
   no dearer than a fresh prefill: ``PREFIX_HIT``. Strong holders full or dearer: the prefix is
   hot, replicate it to the next instance in its hash order (``REPLICATE``). No strong holder
   (new group, or only a shared system prompt matched): place by hash of the first novel block,
   power of ``placement_choices`` among the least-loaded instances (``NO_MATCH``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from warmfleet.core.types import (
    Decision,
    FleetSnapshot,
    InstanceId,
    InstanceState,
    Reason,
    RoutingKey,
)
from warmfleet.routing.config import PrefixAffinityConfig
from warmfleet.routing.index import ApproxPrefixIndex, ExactPrefixIndex
from warmfleet.routing.ring import RendezvousHash

_FANOUT_ENTRIES = 1 << 17
_LEDGER_ENTRIES = 4096  # per instance; a caller that never reports completions cannot grow it
_instance_id = attrgetter("instance_id")
_capacity = attrgetter("kv_capacity_blocks")
_tokens = attrgetter("in_flight_tokens")


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


class WorkLedger:
    """Predicted in-flight work per instance: what each routed request adds to its engine.

    A request's *work* is its predicted uncached prompt tokens plus its expected output tokens
    (a cache hit costs its engine a fraction of its size; the caller's ``in_flight_tokens``
    counts its whole prompt). The strategy learns only routings, so the ledger is reconciled
    against the caller's counts at every decision: when an instance reports fewer in-flight
    requests than the ledger holds, the finished ones are dropped (the entry whose tokens equal
    the caller's drop when exactly one finished, else the oldest). In-flight tokens the ledger
    does not know (another gateway replica, a restart, a mismatch) count in full, so the
    estimate errs towards "busy".
    """

    def __init__(self) -> None:
        self._entries: dict[InstanceId, deque[tuple[int, int]]] = {}
        self._tokens: dict[InstanceId, int] = {}
        self._work: dict[InstanceId, int] = {}

    def add(self, instance_id: InstanceId, tokens: int, work: int) -> None:
        entries = self._entries.get(instance_id)
        if entries is None:
            entries = self._entries[instance_id] = deque()
            self._tokens[instance_id] = self._work[instance_id] = 0
        entries.append((tokens, work))
        self._tokens[instance_id] += tokens
        self._work[instance_id] += work
        if len(entries) > _LEDGER_ENTRIES:
            self._drop(instance_id, entries, entries.popleft())

    def _drop(
        self, instance_id: InstanceId, entries: deque[tuple[int, int]], entry: tuple[int, int]
    ) -> None:
        self._tokens[instance_id] -= entry[0]
        self._work[instance_id] -= entry[1]
        if not entries:
            self._tokens[instance_id] = self._work[instance_id] = 0

    def loads(self, instances: Sequence[InstanceState], requests_only_work: int) -> list[int]:
        """Estimated in-flight work per instance (reconciles first; idempotent per snapshot).

        ``requests_only_work``: the work assumed per unknown request when the caller tracks
        request counts only (every ``in_flight_tokens`` is 0).
        """
        tokens_known = any(map(_tokens, instances))
        out = []
        all_entries = self._entries
        for state in instances:
            entries = all_entries.get(state.instance_id)
            if entries is None:
                known_tokens = known_work = known = 0
            else:
                if len(entries) > state.in_flight_requests:
                    self._reconcile(state, entries)
                known = len(entries)
                known_tokens = self._tokens[state.instance_id]
                known_work = self._work[state.instance_id]
            if tokens_known:
                out.append(known_work + max(0, state.in_flight_tokens - known_tokens))
            else:
                out.append(
                    known_work + max(0, state.in_flight_requests - known) * requests_only_work
                )
        return out

    def _reconcile(self, state: InstanceState, entries: deque[tuple[int, int]]) -> None:
        iid = state.instance_id
        if len(entries) == state.in_flight_requests + 1:
            gone = self._tokens[iid] - state.in_flight_tokens
            for entry in entries:
                if entry[0] == gone:
                    entries.remove(entry)
                    self._drop(iid, entries, entry)
                    return
        while len(entries) > state.in_flight_requests:
            self._drop(iid, entries, entries.popleft())

    def retain(self, instance_ids: Sequence[InstanceId]) -> None:
        keep = set(instance_ids)
        for iid in [i for i in self._entries if i not in keep]:
            del self._entries[iid], self._tokens[iid], self._work[iid]


class PrefixAffinityStrategy:
    name = "prefix_affinity"

    def __init__(self, config: PrefixAffinityConfig) -> None:
        self.config = config
        self.index = ApproxPrefixIndex(config.default_capacity_blocks)
        self.exact_index = ExactPrefixIndex()
        self.ring = RendezvousHash()
        self._last_ids: list[InstanceId] = []
        self._last_caps: list[int] = []
        self._last_pos: dict[InstanceId, int] = {}
        # Branch points: block hash -> distinct continuations seen after it (bounded LRU).
        self._fanout: OrderedDict[int, int] = OrderedDict()
        # Ends of routed prompts (last block of a key, bounded LRU): a later request that
        # matches up to one of them continues that prompt (a conversation's next turn).
        self._ends: OrderedDict[int, None] = OrderedDict()
        self.ledger = WorkLedger()

    # ---------------------------------------------------------------------------------- state

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        hashes = key.block_hashes
        self.index.insert(decision.instance_id, hashes)
        prompt = key.prompt_tokens
        cached = decision.predicted_cached_blocks * _tokens_per_block(key)
        self.ledger.add(
            decision.instance_id,
            prompt + key.output_tokens_hint,
            max(0, round(prompt - cached)) + key.output_tokens_hint,
        )
        if hashes:
            ends = self._ends
            ends[hashes[-1]] = None
            ends.move_to_end(hashes[-1])
            if len(ends) > _FANOUT_ENTRIES:
                ends.popitem(last=False)
        branch = decision.best_cached_blocks
        if 0 < branch < len(hashes):  # a new continuation of a known prefix
            fanout = self._fanout
            parent = hashes[branch - 1]
            fanout[parent] = fanout.get(parent, 0) + 1
            fanout.move_to_end(parent)
            if len(fanout) > _FANOUT_ENTRIES:
                fanout.popitem(last=False)

    def fanout(self, block_hash: int) -> int:
        """Distinct continuations routed after the prefix ending at ``block_hash``."""
        return self._fanout.get(block_hash, 0)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.index.retain(instance_ids)
        self.exact_index.retain(instance_ids)
        self.ledger.retain(instance_ids)
        self.ring.set_instances(instance_ids)
        self._last_ids = []

    def _fleet_ids(
        self, instances: Sequence[InstanceState]
    ) -> tuple[list[InstanceId], dict[InstanceId, int]]:
        """Instance ids and positions; mirrors capacities into the index when they change."""
        ids = list(map(_instance_id, instances))
        caps = list(map(_capacity, instances))
        if ids != self._last_ids or caps != self._last_caps:
            for iid, cap in zip(ids, caps, strict=True):
                self.index.set_capacity(iid, cap)
            self._last_ids, self._last_caps = ids, caps
            self._last_pos = {iid: i for i, iid in enumerate(ids)}
        return ids, self._last_pos

    def match(self, key: RoutingKey) -> dict[InstanceId, int]:
        """Matched leading blocks per instance (exact knowledge wins where available)."""
        matches = self.index.match(key.block_hashes)
        exact = self.exact_index
        if self.config.use_exact_index and exact.known_instances:
            exact_matches = exact.match(key.block_hashes)
            for iid in exact.known_instances:
                blocks = exact_matches.get(iid)
                if blocks:
                    matches[iid] = blocks
                else:
                    matches.pop(iid, None)
        return matches

    # --------------------------------------------------------------------------------- choose

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        view = self._view(key, fleet)
        cfg = self.config
        linear, attention, lw = (
            cfg.prefill_linear_coeff,
            cfg.prefill_attention_coeff,
            cfg.load_weight,
        )
        prompt = key.prompt_tokens
        tokens_per_block = view.tokens_per_block
        strong_blocks = max(1.0, cfg.min_match_fraction * prompt / tokens_per_block)
        best = view.best_blocks
        if 0 < best < strong_blocks and self._private(key.block_hashes[best - 1]):
            strong_blocks = best  # a short but private prefix (a conversation): follow it
        loads, cap_load = view.loads, view.cap_load
        # The cheapest eligible holder of a strong match.
        holder, holder_cost, holder_blocks, holder_load = "", float("inf"), 0, 0
        strong_any = False
        for iid, blocks in view.matches.items():
            if blocks < strong_blocks:
                continue
            strong_any = True
            load = loads[view.pos[iid]]
            if load > cap_load:
                continue
            uncached = prompt - blocks * tokens_per_block
            cost = prefill_work(uncached, prompt, linear, attention) + lw * load
            if cost < holder_cost or (cost == holder_cost and (load, iid) < (holder_load, holder)):
                holder, holder_cost, holder_blocks, holder_load = iid, cost, blocks, load
        fresh_cost = prefill_work(prompt, prompt, linear, attention) + lw * min(loads)
        if holder and holder_cost <= fresh_cost:
            return Decision(holder, Reason.PREFIX_HIT, holder_blocks, view.best_blocks)
        if strong_any:
            return self._replicate(key, view, holder, holder_cost)
        return self._place_new(key, view)

    def _private(self, block_hash: int) -> bool:
        """The match ends where an earlier prompt ended (this request continues it, as a
        conversation's next turn does) and fewer than ``shared_prefix_fanout`` other
        continuations were seen. A system prompt shared by many conversations ends inside
        every earlier prompt, so it is never private."""
        return (
            block_hash in self._ends
            and self._fanout.get(block_hash, 0) < self.config.shared_prefix_fanout
        )

    def _view(self, key: RoutingKey, fleet: FleetSnapshot) -> _View:
        instances = fleet.instances
        work = key.prompt_tokens + key.output_tokens_hint
        ids, pos = self._fleet_ids(instances)
        loads = self.ledger.loads(instances, work)
        matches = self.match(key) if key.block_hashes else {}
        if matches:
            matches = {iid: blocks for iid, blocks in matches.items() if iid in pos}
        best = max(matches.values(), default=0)
        tokens_per_block = _tokens_per_block(key)
        # the least this request adds anywhere: its uncached part at the best holder + output
        least_work = max(0.0, key.prompt_tokens - best * tokens_per_block) + key.output_tokens_hint
        return _View(
            ids=ids,
            loads=loads,
            pos=pos,
            matches=matches,
            best_blocks=best,
            work=work,
            cap_load=max(
                (1.0 + self.config.epsilon) * (sum(loads) + least_work) / len(loads),
                self.config.load_floor_requests * work,
            ),
            tokens_per_block=tokens_per_block,
        )

    def _replicate(
        self, key: RoutingKey, view: _View, holder: InstanceId, holder_cost: float
    ) -> Decision:
        """Hot prefix: the next instance in the prefix's hash order that beats staying put."""
        cfg = self.config
        prompt = key.prompt_tokens
        fresh = prefill_work(prompt, prompt, cfg.prefill_linear_coeff, cfg.prefill_attention_coeff)
        limit = (holder_cost - fresh) / cfg.load_weight if cfg.load_weight > 0 else float("inf")
        loads, matches = view.loads, view.matches
        chosen = ""
        for iid in self.ring.walk(key.block_hashes[view.best_blocks - 1], view.ids):
            load = loads[view.pos[iid]]
            if iid not in matches and load <= view.cap_load and load < limit:
                chosen = iid
                break
        if not chosen:
            if holder:  # every cheaper instance holds part of the prefix: stay
                return Decision(holder, Reason.PREFIX_HIT, matches[holder], view.best_blocks)
            chosen = min(zip(loads, view.ids, strict=True))[1]
        return Decision(
            chosen, Reason.REPLICATE, matches.get(chosen, 0), view.best_blocks, spilled=True
        )

    def _place_new(self, key: RoutingKey, view: _View) -> Decision:
        """New prefix group: hash of its first novel block, among the least-loaded instances."""
        cfg = self.config
        hashes = key.block_hashes
        anchor = hashes[view.best_blocks] if view.best_blocks < len(hashes) else key.prefix_hash
        loads = view.loads
        mean_load = sum(loads) / len(loads)
        band = min(min(loads) + max(view.work, cfg.epsilon * mean_load), view.cap_load)
        band_ids = [iid for iid, load in zip(view.ids, loads, strict=True) if load <= band]
        order = self.ring.walk(anchor, band_ids)[: cfg.placement_choices]
        occupancy, pos, matches = self.index.occupancy, view.pos, view.matches
        if cfg.placement_by == "cost":
            prompt, tpb = key.prompt_tokens, view.tokens_per_block
            lin, attn, lw = cfg.prefill_linear_coeff, cfg.prefill_attention_coeff, cfg.load_weight

            def rank(iid: InstanceId) -> tuple[float, int, int]:
                uncached = prompt - matches.get(iid, 0) * tpb
                cost = prefill_work(uncached, prompt, lin, attn) + lw * loads[pos[iid]]
                return (cost, occupancy(iid), order.index(iid))

            chosen = min(order, key=rank)
        elif cfg.placement_by == "load":
            chosen = min(order, key=lambda iid: (loads[pos[iid]], occupancy(iid), order.index(iid)))
        else:
            chosen = min(order, key=lambda iid: (occupancy(iid), order.index(iid)))
        return Decision(chosen, Reason.NO_MATCH, view.matches.get(chosen, 0), view.best_blocks)


def _tokens_per_block(key: RoutingKey) -> float:
    """Prompt tokens per key block (keys may count characters or bytes instead of tokens)."""
    if key.units and key.prompt_tokens:
        return key.prompt_tokens * key.block_size / key.units
    return 1.0


@dataclass(slots=True)
class _View:
    """One decision's view of the fleet."""

    ids: list[InstanceId]
    loads: list[int]
    pos: dict[InstanceId, int]
    matches: dict[InstanceId, int]
    best_blocks: int
    work: int
    cap_load: float
    tokens_per_block: float
