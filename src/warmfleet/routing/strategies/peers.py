"""Reproductions of two peers' published routing algorithms, as comparison baselines.

These are *reproductions* written from the peers' documentation (docs/routing.md cites the
sources), on warmfleet's block-hash keys; they are not the peers' code.

- ``sglang_cache_aware``: SGLang / SGLang Model Gateway ``cache_aware`` (cache_threshold 0.3,
  balance_abs_threshold 64, balance_rel_threshold 1.5, approximate LRU tree per worker;
  on a cache miss the worker with the smallest tree).
- ``llmd_approx``: llm-d's approximate prefix-cache scorer mixed with the queue and KV-utilisation
  scorers (weights 3 / 2 / 2), max-score picker with random tie-break.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from warmfleet.core.types import Decision, FleetSnapshot, InstanceId, Reason, RoutingKey
from warmfleet.routing.config import LlmdApproxConfig, SglangCacheAwareConfig
from warmfleet.routing.index import ApproxPrefixIndex


class SglangCacheAwareStrategy:
    """Reproduction of SGLang's ``cache_aware`` policy (load = router-tracked in-flight requests).

    1. If ``max_load - min_load > balance_abs_threshold`` and
       ``max_load > balance_rel_threshold * min_load``: the least-loaded worker (fleet-wide gate).
    2. Else the longest prefix match; if ``matched / total > cache_threshold``: that worker.
    3. Else the worker with the smallest tree.
    The tree learns every routed request. SGLang's tree is per character and evicts on a timer
    down to ``max_tree_size``; here it is per key block and evicts on insert.
    """

    name = "sglang_cache_aware"
    reads_block_hashes = True

    def __init__(self, config: SglangCacheAwareConfig) -> None:
        self.config = config
        self.index = ApproxPrefixIndex(config.max_tree_blocks)

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        cfg = self.config
        instances = fleet.instances
        loads = [s.in_flight_requests for s in instances]
        ids = [s.instance_id for s in instances]
        max_load, min_load = max(loads), min(loads)
        matches = self.index.match(key.block_hashes)
        best_blocks = max((matches.get(i, 0) for i in ids), default=0)
        if (
            max_load - min_load > cfg.balance_abs_threshold
            and max_load > cfg.balance_rel_threshold * min_load
        ):
            chosen = ids[loads.index(min_load)]
            return Decision(chosen, Reason.LOAD_BALANCE, matches.get(chosen, 0), best_blocks)
        total = len(key.block_hashes)
        if total and best_blocks / total > cfg.cache_threshold:
            # Several workers may share the longest match: the less loaded one.
            best = min(
                (i for i in range(len(ids)) if matches.get(ids[i], 0) == best_blocks),
                key=lambda i: loads[i],
            )
            return Decision(ids[best], Reason.PREFIX_HIT, best_blocks, best_blocks)
        occupancy = self.index.occupancy
        chosen_id = min(ids, key=occupancy)
        return Decision(chosen_id, Reason.NO_MATCH, matches.get(chosen_id, 0), best_blocks)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.index.insert(decision.instance_id, key.block_hashes)

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.index.retain(instance_ids)


class LlmdApproxStrategy:
    """Reproduction of llm-d's approximate scheduling profile.

    score = prefix_weight * matched/total (first ``max_prefix_blocks_to_match`` blocks)
          + queue_weight * (max_q - q) / (max_q - min_q)   (1 when all queues are equal)
          + kv_utilization_weight * (1 - kv_usage)
    Max score wins; ties at random. The per-server LRU (``lru_capacity_per_server`` blocks)
    learns from routing history, like the GIE prefix plugin's PreRequest hook. The queues and
    KV usage are the engines' as last polled, every ``engine_stats_interval_s``
    (``routing.base.engine_stats_interval_of``).
    """

    name = "llmd_approx"
    reads_block_hashes = True

    def __init__(self, config: LlmdApproxConfig, rng: random.Random) -> None:
        self.config = config
        self.engine_stats_interval_s = config.refresh_metrics_interval_ms / 1000.0
        self.index = ApproxPrefixIndex(config.lru_capacity_per_server)
        self._rng = rng

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        cfg = self.config
        instances = fleet.instances
        blocks = key.block_hashes[: cfg.max_prefix_blocks_to_match]
        total = len(blocks)
        matches = self.index.match(blocks)
        queues = [s.waiting_requests for s in instances]
        max_q, min_q = max(queues), min(queues)
        spread = max_q - min_q
        scores: list[float] = []
        for s, q in zip(instances, queues, strict=True):
            prefix = matches.get(s.instance_id, 0) / total if total else 0.0
            queue = (max_q - q) / spread if spread else 1.0
            kv = 1.0 - min(max(s.kv_usage_frac, 0.0), 1.0)
            scores.append(
                cfg.prefix_weight * prefix
                + cfg.queue_weight * queue
                + cfg.kv_utilization_weight * kv
            )
        top = max(scores)
        ties = [i for i, score in enumerate(scores) if score == top]
        pick = ties[0] if len(ties) == 1 else ties[self._rng.randrange(len(ties))]
        chosen = instances[pick].instance_id
        matched = matches.get(chosen, 0)
        best = max(matches.values(), default=0)
        reason = Reason.PREFIX_HIT if matched else Reason.LOAD_BALANCE
        return Decision(chosen, reason, matched, best)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.index.insert(
            decision.instance_id, key.block_hashes[: self.config.max_prefix_blocks_to_match]
        )

    def on_instances_changed(self, instance_ids: Sequence[InstanceId]) -> None:
        self.index.retain(instance_ids)
