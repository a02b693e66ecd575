"""Engine block hashes -> router chained hashes, sequence tracking, exact/approximate mode."""

from __future__ import annotations

import logging
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import xxhash

from warmfleet.api.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    Mode,
)
from warmfleet.core.types import InstanceId
from warmfleet.gateway.kv_events.view import (
    InstanceView,
    ReplayRequest,
    TranslatorStats,
    follows_group,
    prune_untracked,
)

log = logging.getLogger(__name__)
_h64 = xxhash.xxh3_64_intdigest
# ``translate`` value of an engine block the router's keys cannot name: stored for a LoRA
# adapter, with extra hash keys (multimodal, cache salt, prompt embeddings), or a child of one.
_FOREIGN = -1
# Topics of no routed instance followed at once (an instance another gateway replica routes to
# before this one discovers it, a data-parallel rank's own topic); past it they are ignored.
MAX_UNROUTED_VIEWS = 64


def router_block_hashes(token_ids: Sequence[int], block_size: int, parent: int) -> list[int]:
    """The router's chained hashes (``chains.chain_buffer`` over uint64 ids) of full blocks."""
    out: list[int] = []
    prev = parent
    for start in range(0, len(token_ids) - len(token_ids) % block_size, block_size):
        prev = _h64(array("Q", token_ids[start : start + block_size]).tobytes(), prev)
        out.append(prev)
    return out


@runtime_checkable
class ExactIndex(Protocol):
    """What the translator feeds: ``routing.exact_index.ExactPrefixIndex`` (a ``KvEventSink``
    that can also forget an instance, so the strategy falls back to its approximate index for
    it)."""

    def on_blocks_stored(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None: ...

    def on_blocks_removed(self, instance_id: InstanceId, block_hashes: Sequence[int]) -> None: ...

    def on_instance_cleared(self, instance_id: InstanceId) -> None: ...

    def remove_instance(self, instance_id: InstanceId) -> None: ...

    # where the translated chains start (the translator's seed): keys chained from elsewhere
    # (a tenant, an adapter) are matched on the approximate index instead
    chain_seed: int | None

    def comparable(self, key_chain_seed: int | None) -> bool: ...


def _primary_tier(medium: str | None) -> bool:
    """The engine's own KV cache (vLLM's ``GPU``; no medium: an older vLLM). Offload tiers
    (``CPU``, ``STORAGE``...) publish the same block hashes with their own stores and removals."""
    return medium is None or medium.upper() == "GPU"


def _foreign_from(event: BlockStored, parent: int) -> int:
    """Index of the event's first block that the router's keys cannot name (its length: none)."""
    if parent == _FOREIGN or event.lora_name is not None or event.lora_id is not None:
        return 0
    for i, keys in enumerate(event.extra_keys or ()):
        if keys:
            return i
    return len(event.block_hashes)


class KvEventTranslator:
    """Per-instance engine->router hash translation, sequence tracking and exact/approx mode.

    Pure (no I/O): the caller passes ``now_s`` from its clock.
    """

    def __init__(
        self,
        index: ExactIndex,
        seed: int,
        block_size: int,
        *,
        resync_batches: int = 3,
        silence_timeout_s: float = 10.0,
        replay: bool = False,
    ) -> None:
        """``replay``: on a gap (or a late join) ask the engine to replay what was missed
        (``take_replay_requests``) and hold the instance's batches until ``replay_steps``
        applies the answer; the fall-back to approximate happens only if the replay cannot
        fill the gap."""
        self.index = index
        self.replay = replay
        self._replay_requests: list[ReplayRequest] = []
        self._replay_serial = 0
        self.seed = seed
        self.block_size = block_size
        self.resync_batches = resync_batches
        self.silence_timeout_s = silence_timeout_s
        self.stats = TranslatorStats()
        self._views: dict[InstanceId, InstanceView] = {}
        self.routed: frozenset[InstanceId] | None = None  # None: not told yet (``retain``)
        self._unrouted = 0  # views of instances not in ``routed``, since it was set

    def mode(self, instance_id: InstanceId) -> Mode:
        view = self._views.get(instance_id)
        return view.mode if view is not None else "approximate"

    def modes(self) -> dict[InstanceId, Mode]:
        return {iid: v.mode for iid, v in self._views.items()}

    def describe(self) -> dict[str, Any]:
        return {
            "instances": {iid: v.describe() for iid, v in self._views.items()},
            "stats": vars(self.stats).copy(),
        }

    def apply(self, instance_id: InstanceId, seq: int, batch: EventBatch, now_s: float) -> None:
        view = self._views.get(instance_id)
        if view is None:
            if self.routed is not None and instance_id not in self.routed:
                if self._unrouted >= MAX_UNROUTED_VIEWS:
                    self.stats.unrouted_batches += 1
                    return
                self._unrouted += 1
            view = self._views[instance_id] = InstanceView()
        if view.stash is not None:
            if seq != 0:
                view.stash.append((seq, batch))  # applied in order once the replay is in
                view.expect_by_s = None  # the engine is not silent
                return
            view.stash, view.draining = None, False  # the engine restarted: the gap is moot
        self._apply(instance_id, view, seq, batch, now_s, replay=self.replay)

    def take_replay_requests(self) -> list[ReplayRequest]:
        """The replays asked for since the last call."""
        requests, self._replay_requests = self._replay_requests, []
        return requests

    def replay_steps(
        self,
        request: ReplayRequest,
        batches: Sequence[tuple[int, EventBatch]] | None,
        now_s: float,
    ) -> Iterator[None]:
        """Apply the engine's answer to a replay request (``None``: none came), one batch per
        step (a caller on an event loop can yield between steps; batches that arrive
        meanwhile queue behind). If it holds every missed batch they are applied, then the
        held ones, as if nothing had been lost; otherwise the gap is handled as without replay
        (fall back, resync)."""
        view = self._views.get(request.instance_id)
        if view is None or view.stash is None or view.draining:
            return
        if view.replay_serial != request.serial:
            return  # the engine restarted meanwhile, or an answer to an older request
        view.draining = True
        missed = range(view.replay_from, view.stash[0][0])
        got = {seq: b for seq, b in batches or () if seq in missed}
        recovered = len(got) == len(missed)
        if recovered:
            self.stats.replays_recovered += 1
            for seq in missed:
                if not view.draining:
                    return  # the engine restarted (or was forgotten) meanwhile
                self._apply(request.instance_id, view, seq, got[seq], now_s, replay=False)
                yield
        # a gap inside the held batches may be replayed; the one that failed may not
        may_replay = self.replay and recovered
        while view.draining and view.stash:
            seq, batch = view.stash.popleft()
            self._apply(request.instance_id, view, seq, batch, now_s, replay=may_replay)
            may_replay = self.replay
            yield
        if view.draining:
            view.stash, view.draining = None, False

    def _apply(
        self,
        instance_id: InstanceId,
        view: InstanceView,
        seq: int,
        batch: EventBatch,
        now_s: float,
        *,
        replay: bool,
    ) -> None:
        expected = 0 if view.last_seq is None else view.last_seq + 1
        if replay and seq > expected:  # a gap, or a late join: ask for what was missed
            self._replay_serial += 1
            if view.stash is None:
                view.stash = deque()
            view.stash.appendleft((seq, batch))  # held, with the rest if a replay is applied
            view.draining = False
            view.replay_from, view.replay_serial = expected, self._replay_serial
            view.expect_by_s = None
            self._replay_requests.append(ReplayRequest(instance_id, expected, self._replay_serial))
            self.stats.replays += 1
            return
        self.stats.batches += 1
        view.last_seq = seq
        view.last_batch_s = now_s
        view.expect_by_s = None
        if seq == 0:  # the engine's whole history (first batch, or the engine restarted)
            view.primary_group, view.followed_group_0 = None, False  # maybe another model now
            if expected != 0:
                view.translate.clear()
                view.held.clear()
                self.index.on_instance_cleared(instance_id)
            self._enter_exact(instance_id, view)
        elif expected == 0:
            self.stats.late_joins += 1
            self._fall_back(instance_id, view, f"joined late: first batch is number {seq}")
        elif seq != expected:
            self.stats.gaps += 1
            self._fall_back(instance_id, view, f"sequence gap: expected {expected}, got {seq}")
        elif view.silent:  # the batch after a silence, in sequence: nothing was lost
            self._enter_exact(instance_id, view)
        clean = True
        for event in batch.events:
            clean = self._apply_event(instance_id, view, event) and clean
        view.peak_held = max(view.peak_held, len(view.held))
        self.stats.pruned_translations += prune_untracked(view)
        if view.mode == "approximate":
            view.clean_batches = view.clean_batches + 1 if clean else 0
            if view.clean_batches >= self.resync_batches:
                self._enter_exact(instance_id, view)

    def _apply_event(self, instance_id: InstanceId, view: InstanceView, event: KvEvent) -> bool:
        """Apply one event; False if part of it could not be translated."""
        if isinstance(event, AllBlocksCleared):  # a full reset: the view is complete again
            view.translate.clear()
            view.held.clear()
            self._enter_exact(instance_id, view)
            self.index.on_instance_cleared(instance_id)
            return True
        if not _primary_tier(event.medium):
            self.stats.other_tier_events += 1
            return True
        kind = event.kv_cache_spec_kind if isinstance(event, BlockStored) else None
        followed, switched = follows_group(view, event.group_idx, kind)
        if switched:  # group 0 was followed until a full-attention group showed up
            self._fall_back(instance_id, view, f"KV cache group {view.primary_group} followed")
        if not followed:
            self.stats.other_group_events += 1
            return True
        if isinstance(event, BlockRemoved):
            gone = []
            for engine_hash in event.block_hashes:
                ours = view.translate.pop(engine_hash, None)
                view.held.discard(engine_hash)
                if ours is not None and ours != _FOREIGN:
                    gone.append(ours)
            if view.mode == "exact" and gone:
                self.index.on_blocks_removed(instance_id, gone)
            return True
        return self._stored(instance_id, view, event)

    def _stored(self, instance_id: InstanceId, view: InstanceView, event: BlockStored) -> bool:
        if event.block_size != self.block_size:
            self.stats.block_size_mismatches += 1
            self._fall_back(
                instance_id,
                view,
                f"engine block size {event.block_size} != router block size {self.block_size}",
            )
            return False
        if event.parent_block_hash is None:
            parent = self.seed
        else:
            known = view.translate.get(event.parent_block_hash)
            if known is None:
                self.stats.untranslatable_blocks += len(event.block_hashes)
                self._fall_back(instance_id, view, "stored block with an unknown parent")
                return False
            parent = known
        engine = event.block_hashes
        if len(event.token_ids) // self.block_size != len(engine):
            self.stats.untranslatable_blocks += len(engine)
            return False
        # Blocks the router cannot name (and their children) are remembered, never indexed:
        # a base-model prompt with the same tokens would not hit them in the engine.
        split = _foreign_from(event, parent)
        tokens = (
            event.token_ids if split == len(engine) else event.token_ids[: split * self.block_size]
        )
        ours = router_block_hashes(tokens, self.block_size, parent)
        if split < len(engine):
            self.stats.foreign_blocks += len(engine) - split
            view.translate.update(dict.fromkeys(engine[split:], _FOREIGN))
        view.translate.update(zip(engine[:split], ours, strict=True))
        view.held.update(engine)  # foreign blocks too: their translation is live
        if view.mode == "exact" and ours:
            self.index.on_blocks_stored(instance_id, ours)
        return True

    def _fall_back(
        self, instance_id: InstanceId, view: InstanceView, cause: str, *, silence: bool = False
    ) -> None:
        """Approximate until resynced; ``silence``: nothing is known to be lost yet, so what
        was held stays (whole if the view was, ``InstanceView.silent``)."""
        view.silent = silence and (view.mode == "exact" or view.silent)
        if view.mode == "exact":
            log.warning("kv events for %s: %s; approximate until resynced", instance_id, cause)
            self.index.remove_instance(instance_id)
        view.mode = "approximate"
        if not view.silent:
            view.held.clear()  # what was held is no longer known; translations stay valid
        view.clean_batches = 0
        view.cause = cause

    def _enter_exact(self, instance_id: InstanceId, view: InstanceView) -> None:
        """Back to exact: the index gets the blocks seen since the sync point (after a gap a
        subset of the truth: missed hits at worst, never a predicted hit that is not there)."""
        view.silent = False
        if view.mode == "exact":
            return
        view.mode = "exact"
        view.cause = "in sync"
        self._publish_view(self.index, instance_id, view)

    @staticmethod
    def _publish_view(index: ExactIndex, instance_id: InstanceId, view: InstanceView) -> None:
        index.on_instance_cleared(instance_id)  # known, empty
        translate = view.translate
        held = [translate[h] for h in view.held if translate.get(h, _FOREIGN) != _FOREIGN]
        if held:
            index.on_blocks_stored(instance_id, held)

    def expect_events(self, instance_id: InstanceId, now_s: float) -> None:
        """A request that must store new blocks went to ``instance_id``: a batch is due."""
        view = self._views.setdefault(instance_id, InstanceView())
        if view.expect_by_s is None:
            view.expect_by_s = now_s + self.silence_timeout_s

    def check_silence(self, now_s: float) -> list[InstanceId]:
        """Instances whose expected batch did not come in time go approximate."""
        silent = []
        for iid, view in self._views.items():
            if view.expect_by_s is not None and now_s > view.expect_by_s:
                view.expect_by_s = None
                self.stats.silences += 1
                self._fall_back(
                    iid, view, "no events after a routed request (silence)", silence=True
                )
                silent.append(iid)
        return silent

    def retain(self, instance_ids: Iterable[InstanceId]) -> None:
        """The routed instances are now ``instance_ids``: the others' views go, and at most
        ``MAX_UNROUTED_VIEWS`` topics of no routed instance are followed until the next call."""
        self.routed = frozenset(instance_ids)
        self.forget([i for i in self._views if i not in self.routed])
        self._unrouted = 0

    def forget(self, instance_ids: Iterable[InstanceId]) -> None:
        for iid in instance_ids:
            view = self._views.pop(iid, None)
            if view is not None:  # a replay being applied stops there
                view.stash, view.draining = None, False

    def rebind(self, index: ExactIndex) -> None:
        """Feed ``index`` from now on (a router swapped in by a reload): it gets the current
        exact view of every in-sync instance."""
        self.index = index
        for iid, view in self._views.items():
            if view.mode == "exact":
                self._publish_view(index, iid, view)


class BatchConsumer(Protocol):
    """What a subscriber feeds (a ``KvEventTranslator`` or a gateway's ``KvEventFeed``)."""

    def apply(self, instance_id: InstanceId, seq: int, batch: EventBatch, now_s: float) -> None: ...

    def check_silence(self, now_s: float) -> list[InstanceId]: ...

    def take_replay_requests(self) -> list[ReplayRequest]: ...

    def replay_steps(
        self,
        request: ReplayRequest,
        batches: Sequence[tuple[int, EventBatch]] | None,
        now_s: float,
    ) -> Iterator[None]: ...
