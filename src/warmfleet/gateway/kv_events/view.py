"""Per-instance state of the KV-event translator, its counters and its replay requests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from warmfleet.api.kv_events import EngineHash, EventBatch, Mode
from warmfleet.core.types import InstanceId

# Translations of blocks not known to be held (a removal lost in an unrecovered gap leaves one
# behind for good) are kept up to this many per instance, or twice the most blocks it was seen
# to hold if more; past that the oldest go (one still needed costs a fall-back and a resync).
UNTRACKED_TRANSLATIONS = 1 << 16


@dataclass
class InstanceView:
    mode: Mode = "approximate"
    last_seq: int | None = None
    # engine hash -> router hash: a pure function of the tokens, kept while the block may exist
    translate: dict[EngineHash, int] = field(default_factory=dict)
    # engine hashes known to be held since the last sync point (a subset of the truth after a gap)
    held: set[EngineHash] = field(default_factory=set)
    peak_held: int = 0
    # A hybrid model's KV cache group that stands for the instance: the first full-attention
    # group it reported (None: none reported yet; group 0 is followed meanwhile).
    primary_group: int | None = None
    followed_group_0: bool = False  # group-0 events were followed before primary_group was known
    clean_batches: int = 0
    # Waiting for a replay of the batches from ``replay_from`` on, or applying one
    # (``draining``): the batches that arrive meanwhile, in order (None: neither).
    stash: deque[tuple[int, EventBatch]] | None = None
    draining: bool = False
    replay_from: int = 0
    replay_serial: int = 0
    last_batch_s: float = 0.0
    expect_by_s: float | None = None
    # Approximate for a silence only: ``held`` is still whole, so the next batch in sequence
    # (nothing was lost) brings the instance back to exact at once. vLLM reports a block when
    # it stores it, never again on a hit: a view rebuilt from later batches would miss a hot
    # prefix stored before for as long as it stays cached.
    silent: bool = False
    cause: str = "no events yet"

    def describe(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "last_seq": self.last_seq,
            "cause": self.cause,
            "held_blocks": len(self.held),
            "translations": len(self.translate),
            "kv_cache_group": self.primary_group,
        }


def follows_group(view: InstanceView, group: int | None, kind: str | None) -> tuple[bool, bool]:
    """(whether an event of KV cache ``group`` is followed, whether the followed group just
    changed). ``kind``: the group's ``kv_cache_spec_kind`` (stores carry it, removals do not).

    A hybrid model (full attention with sliding-window or Mamba layers) reports each block
    once per group, with the group's own block size and evictions. A prefix hit needs the
    full-attention blocks, so the first full-attention group reported is followed and the
    others are ignored: a sliding-window eviction must not drop a block still held for full
    attention. Until a full-attention group shows up, group 0 is followed (a model with one
    group of another kind, or an engine that names no kinds). Events without a group (older
    vLLM) are all followed."""
    if group is None:
        return True, False
    switched = False
    if kind == "full_attention" and view.primary_group is None:
        view.primary_group = group
        switched = group != 0 and view.followed_group_0
    if view.primary_group is None:
        view.followed_group_0 = view.followed_group_0 or group == 0
        return group == 0, False
    return group == view.primary_group, switched


def prune_untracked(view: InstanceView) -> int:
    """Drop the oldest translations of blocks not known to be held, down to half the bound,
    once there are more than ``UNTRACKED_TRANSLATIONS`` (or 2 x the peak held) of them."""
    translate, held = view.translate, view.held
    bound = max(UNTRACKED_TRANSLATIONS, 2 * view.peak_held)
    excess = len(translate) - len(held) - bound
    if excess <= 0:
        return 0
    untracked = (h for h in translate if h not in held)
    drop = list(islice(untracked, excess + bound // 2))
    for engine_hash in drop:
        del translate[engine_hash]
    return len(drop)


class ReplayRequest(NamedTuple):
    """Ask ``instance_id``'s engine for its batches from ``from_seq`` on; ``serial`` ties the
    answer to the request (an answer to an older one is ignored)."""

    instance_id: InstanceId
    from_seq: int
    serial: int


@dataclass
class TranslatorStats:
    batches: int = 0
    gaps: int = 0
    late_joins: int = 0  # first batch seen was not number 0: resync needed, nothing lost yet
    untranslatable_blocks: int = 0
    foreign_blocks: int = 0  # LoRA / extra-key blocks: kept out of the exact index
    other_tier_events: int = 0  # events of an offload tier (medium not GPU): ignored
    other_group_events: int = 0  # events of a hybrid model's other KV cache groups: ignored
    block_size_mismatches: int = 0
    silences: int = 0
    replays: int = 0  # replays asked for (gaps and late joins, with ``replay`` on)
    replays_recovered: int = 0  # ... that delivered every missed batch (no fall-back)
    pruned_translations: int = 0  # untracked translations dropped (UNTRACKED_TRANSLATIONS)
    unrouted_batches: int = 0  # batches of a topic past MAX_UNROUTED_VIEWS: ignored
