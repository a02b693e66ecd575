"""``prefix_affinity``: warmfleet's flagship strategy (docs/routing.md explains every step).

Per request:

0. A request of a known session (``RoutingKey.session``) whose last instance is in the fleet,
   eligible under the bounded-load rule (3.) and not beaten by another instance's longer strong
   match (5.) goes there (``SESSION``); otherwise it takes the steps below, and its session
   moves to wherever it went.
1. Longest-prefix match of the key's chained blocks against the approximate index (per-instance
   LRU mirroring KV capacity), overridden per instance by the exact index for instances that
   report engine KV events, extended there by the blocks routed to them whose events have not
   arrived yet (``routing.claims``, for ``claim_ttl_s``).
2. Load = predicted in-flight work per instance (``WorkLedger``: uncached prompt + output tokens
   of the requests routed there, reconciled against the caller's in-flight counts).
3. Bounded load: an instance is *eligible* if its work is at most
   ``max((1 + epsilon) x mean, load_floor_requests x work)``, the mean counting this request.
   The least-loaded instance is always eligible; no fleet-wide gate ever switches affinity off.
   A private continuation (a conversation's next turn) may pass the bound to stay home; an
   exact repeat of an earlier prompt continues nothing and may not.
4. Cost of an eligible instance = predicted prefill work for its uncached part
   + ``load_weight`` x its in-flight work.
5. A *strong* match covers ``min_match_fraction`` of the prompt or is private: it ends where an
   earlier routed prompt ended, with fewer than ``shared_prefix_fanout`` other continuations.
   Cheapest eligible strong holder no dearer than a fresh prefill: ``PREFIX_HIT``. Strong
   holders full or dearer: the prefix is hot, replicate it to the next instance in its hash
   order (``REPLICATE``). No strong holder (new group, or only a shared system prompt matched):
   a cold start, placed among the least-loaded instances in the hash order of its first novel
   block by ``placement_by`` (default ``recency``: fewest cold starts, then the oldest last
   cold start) (``NO_MATCH``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from warmfleet.core.types import (
    Decision,
    FleetSnapshot,
    InstanceId,
    InstanceState,
    Reason,
    RoutingKey,
)
from warmfleet.routing.config import PrefixAffinityConfig
from warmfleet.routing.exact_index import ExactPrefixIndex
from warmfleet.routing.index import ApproxPrefixIndex
from warmfleet.routing.ledger import WorkLedger
from warmfleet.routing.ring import RendezvousHash
from warmfleet.routing.sessions import SessionHomes
from warmfleet.routing.strategies.affinity_view import REREAD_POSITIONS, Columns, View, prefill_work

_FANOUT_ENTRIES = 1 << 17
# ``recency`` placement: an instance short of cold starts (it joined, was busy, or a stale view
# placed elsewhere) is preferred until even, but takes at most this many cold starts in a row.
COLD_START_DEFICIT = 2


class PrefixAffinityStrategy:
    name = "prefix_affinity"
    reads_block_hashes = True

    def __init__(self, config: PrefixAffinityConfig) -> None:
        self.config = config
        self.index = ApproxPrefixIndex(config.default_capacity_blocks)
        self.exact_index = ExactPrefixIndex(config.claim_ttl_s)
        self._now_s = 0.0  # the latest snapshot's time (claims made by ``on_routed``)
        self.ring = RendezvousHash()
        self._last_ids: tuple[InstanceId, ...] = ()
        self._last_caps: tuple[int, ...] = ()
        self._last_pos: dict[InstanceId, int] = {}
        # The last snapshot's instances and the columns read from them (frozen objects: the
        # same objects carry the same values, so an unchanged snapshot is not re-read).
        self._snap_instances: tuple[InstanceState, ...] = ()
        self._snap: Columns | None = None
        # Branch points: block hash -> distinct continuations seen after it (bounded LRU).
        self._fanout: OrderedDict[int, int] = OrderedDict()
        # Ends of routed prompts (last block of a key, bounded LRU): a later request that
        # matches up to one of them continues that prompt (a conversation's next turn).
        self._ends: OrderedDict[int, None] = OrderedDict()
        self.ledger = WorkLedger()
        # Cold starts (new groups and replicas) placed on each instance, and the serial of
        # the latest one there.
        self._cold_serial = 0
        self._last_cold: dict[InstanceId, int] = {}
        self._cold_counts: dict[InstanceId, int] = {}
        self.sessions = SessionHomes()  # session -> the instance it was last routed to

    # ---------------------------------------------------------------------------------- state

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        hashes = key.block_hashes
        self.index.insert(decision.instance_id, hashes, decision.predicted_cached_blocks)
        if self.exact_index.reporting and self._exact_applies(key):
            claim = self.exact_index.claim
            claim(decision.instance_id, hashes, decision.predicted_cached_blocks, self._now_s)
        if decision.reason is Reason.NO_MATCH or decision.reason is Reason.REPLICATE:
            self._count_cold_start(decision.instance_id)
        if key.session is not None:
            self.sessions.learn(key.session, decision.instance_id)
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

    def _count_cold_start(self, chosen: InstanceId) -> None:
        """A cold start on ``chosen``; every instance more than ``COLD_START_DEFICIT`` behind
        it is brought up to that deficit."""
        self._cold_serial += 1
        self._last_cold[chosen] = self._cold_serial
        counts = self._cold_counts
        top = counts[chosen] = counts.get(chosen, 0) + 1
        floor = top - COLD_START_DEFICIT
        for iid, count in counts.items():
            if count < floor:
                counts[iid] = floor

    def fanout(self, block_hash: int) -> int:
        """Distinct continuations routed after the prefix ending at ``block_hash``."""
        return self._fanout.get(block_hash, 0)

    def in_flight_work(self, fleet: FleetSnapshot, requests_only_work: int = 0) -> list[int]:
        """The predicted in-flight work per instance that the load bound applies to."""
        cols = self._columns(fleet.instances)
        return list(
            self.ledger.loads(fleet.instances, cols.tokens, requests_only_work, cols.counts)
        )

    def _columns(self, instances: tuple[InstanceState, ...]) -> Columns:
        """Ids, positions, in-flight tokens and counts of a snapshot's instances. Frozen
        objects: the same object carries the same values, so only the instances that are not
        the very objects of the previous snapshot are read again (a gateway rebuilds one or two
        a request: the instances whose load moved)."""
        snap = self._snap
        last = self._snap_instances
        if snap is not None and len(instances) == len(last):
            if instances is not last:
                changed = [i for i in range(len(instances)) if instances[i] is not last[i]]
                if len(changed) <= REREAD_POSITIONS:
                    snap = snap.reread(self._last_caps, instances, changed)
                else:
                    snap = None
            if snap is not None:
                self._snap = snap
                self._snap_instances = instances
                return snap
        # Comprehensions, not ``map(attrgetter(...))``: compiled, each reads the attribute
        # straight from the object (attrgetter's generic lookup was 14 us at 64 instances).
        ids = tuple([s.instance_id for s in instances])
        pos = self._fleet_ids(ids, tuple([s.kv_capacity_blocks for s in instances]))
        snap = self._snap = Columns(
            ids,
            pos,
            tuple([s.in_flight_tokens for s in instances]),
            tuple([s.in_flight_requests for s in instances]),
        )
        self._snap_instances = instances
        return snap

    def adopt(self, previous: object) -> None:
        """Take over what a ``prefix_affinity`` this one replaces learnt from routing: the
        approximate index (what each engine is predicted to hold), conversation ends, branch
        points, the sessions' instances and the recency of cold starts. In-flight work is
        re-learnt from the caller's counts; engine KV events re-feed the exact index
        (``KvEventTranslator.rebind``)."""
        if not isinstance(previous, PrefixAffinityStrategy):
            return
        self.index = previous.index
        self.index.default_capacity_blocks = self.config.default_capacity_blocks
        self._fanout, self._ends = previous._fanout, previous._ends
        self._cold_serial, self._last_cold = previous._cold_serial, previous._last_cold
        self._cold_counts = previous._cold_counts
        self.sessions = previous.sessions

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.index.retain(instance_ids)
        self.exact_index.retain(instance_ids)
        self.ledger.retain(instance_ids)
        self.ring.set_instances(instance_ids)
        keep = set(instance_ids)
        self._last_cold = {iid: n for iid, n in self._last_cold.items() if iid in keep}
        counts = {iid: n for iid, n in self._cold_counts.items() if iid in keep}
        start = max(counts.values(), default=0) - COLD_START_DEFICIT  # a newcomer's deficit
        self._cold_counts = {iid: counts.get(iid, max(0, start)) for iid in instance_ids}
        self._last_ids = ()  # the ledger follows the new order at the next decision
        self._snap, self._snap_instances = None, ()

    def _fleet_ids(
        self, ids: tuple[InstanceId, ...], caps: tuple[int, ...]
    ) -> dict[InstanceId, int]:
        """Positions of ``ids``; mirrors capacities into the index when they change."""
        if ids != self._last_ids or caps != self._last_caps:
            for iid, cap in zip(ids, caps, strict=True):
                self.index.set_capacity(iid, cap)
            self._last_ids, self._last_caps = ids, caps
            self._last_pos = {iid: i for i, iid in enumerate(ids)}
            self.ledger.set_order(ids)
        return self._last_pos

    def _exact_applies(self, key: RoutingKey) -> bool:
        return self.config.use_exact_index and self.exact_index.comparable(key.chain_seed)

    def match(self, key: RoutingKey, now_s: float | None = None) -> dict[InstanceId, int]:
        """Matched leading blocks per instance: the engines' word where they report KV events,
        with the blocks claimed there (``routing.claims``: lapsed by ``now_s``, by default the
        latest snapshot's time)."""
        matches = self.index.match(key.block_hashes)
        if self.exact_index.reporting and self._exact_applies(key):
            now = self._now_s if now_s is None else now_s
            self.exact_index.overlay(matches, key.block_hashes, now)
        return matches

    # --------------------------------------------------------------------------------- choose

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        view = self._view(key, fleet)
        if key.session is not None:
            home = self._session_home(key.session, key.prompt_tokens, view)
            if home is not None:
                return home
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
        # A private match continues one earlier prompt (a conversation's next turn): follow it
        # however short it is, and past the load bound (one conversation is one sequential
        # stream, it cannot make a hot spot; moving it would redo its whole history). An exact
        # repeat of an earlier prompt continues nothing: many clients can send the same prompt
        # at once (a retry storm, a popular query, a benchmark), so the bound applies to it.
        hashes = key.block_hashes
        private = 0 < best < len(hashes) and self.is_private(hashes[best - 1])
        if private and best < strong_blocks:
            strong_blocks = float(best)
        loads = view.loads
        cap_load = view.cap_load
        # The cheapest eligible holder of a strong match.
        holder, holder_cost, holder_blocks, holder_load = "", float("inf"), 0, 0
        strong_any = False
        for iid, blocks in view.matches.items():
            if blocks < strong_blocks:
                continue
            strong_any = True
            load = loads[view.pos[iid]]
            if load > cap_load and not (private and blocks == best):
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

    def _session_home(self, session: int, prompt_tokens: int, view: View) -> Decision | None:
        """The session's last instance, if it is in the fleet, within the load bound, and no
        other instance holds a strong match (``min_match_fraction``) longer than its own."""
        home = self.sessions.get(session)
        at = None if home is None else view.pos.get(home)
        if home is None or at is None or view.loads[at] > view.cap_load:
            return None
        held, best = view.matches.get(home, 0), view.best_blocks
        strong = self.config.min_match_fraction * prompt_tokens / view.tokens_per_block
        if best > held and best >= max(1.0, strong):
            return None
        return Decision(home, Reason.SESSION, held, best)

    def is_private(self, block_hash: int) -> bool:
        """The match ends where an earlier prompt ended (this request continues it, as a
        conversation's next turn does) and fewer than ``shared_prefix_fanout`` other
        continuations were seen. A system prompt shared by many conversations ends inside
        every earlier prompt, so it is never private."""
        return (
            block_hash in self._ends
            and self._fanout.get(block_hash, 0) < self.config.shared_prefix_fanout
        )

    def _view(self, key: RoutingKey, fleet: FleetSnapshot) -> View:
        self._now_s = fleet.now_s
        work = key.prompt_tokens + key.output_tokens_hint
        cols = self._columns(fleet.instances)
        ids, pos = cols.ids, cols.pos
        loads = self.ledger.loads(fleet.instances, cols.tokens, work, cols.counts)
        matches = self.match(key) if key.block_hashes else {}
        if matches:
            matches = {iid: blocks for iid, blocks in matches.items() if iid in pos}
        best = max(matches.values(), default=0)
        tokens_per_block = _tokens_per_block(key)
        # the least this request adds anywhere: its uncached part at the best holder + output
        least_work = max(0.0, key.prompt_tokens - best * tokens_per_block) + key.output_tokens_hint
        return View(
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
        self, key: RoutingKey, view: View, holder: InstanceId, holder_cost: float
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

    def _place_new(self, key: RoutingKey, view: View) -> Decision:
        """New prefix group: hash of its first novel block, among the least-loaded instances.
        A session's, with ``session_placement: hash``: the first of them in its session's hash
        order, so a replica that never heard of the session places its next turn there too."""
        cfg = self.config
        loads = view.loads
        mean_load = sum(loads) / len(loads)
        band = min(min(loads) + max(view.work, cfg.epsilon * mean_load), view.cap_load)
        band_ids = [iid for iid, load in zip(view.ids, loads, strict=True) if load <= band]
        if key.session is not None and cfg.session_placement == "hash":
            chosen = self.ring.walk(key.session, band_ids)[0]  # the least loaded is in the band
            return Decision(chosen, Reason.NO_MATCH, view.matches.get(chosen, 0), view.best_blocks)
        hashes = key.block_hashes
        anchor = hashes[view.best_blocks] if view.best_blocks < len(hashes) else key.prefix_hash
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
        elif cfg.placement_by == "recency":
            chosen = self._least_recent(order)
        elif cfg.placement_by == "load":
            chosen = min(order, key=lambda iid: (loads[pos[iid]], occupancy(iid), order.index(iid)))
        else:
            chosen = min(order, key=lambda iid: (occupancy(iid), order.index(iid)))
        return Decision(chosen, Reason.NO_MATCH, view.matches.get(chosen, 0), view.best_blocks)

    def _least_recent(self, order: list[InstanceId]) -> InstanceId:
        """``recency``: fewest cold starts, then the oldest latest one, then hash order. All
        known, the counts stay within one: a rotation; one placed on a stale view (a peer's note
        in flight) is evened out by the next ones, not an extra group on one instance for good."""
        counts, last = self._cold_counts, self._last_cold
        return min(order, key=lambda iid: (counts.get(iid, 0), last.get(iid, 0), order.index(iid)))


def _tokens_per_block(key: RoutingKey) -> float:
    """Prompt tokens per key block (keys may count characters or bytes instead of tokens)."""
    if key.units and key.prompt_tokens:
        return key.prompt_tokens * key.block_size / key.units
    return 1.0
