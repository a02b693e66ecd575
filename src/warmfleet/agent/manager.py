"""Cache manager: resolve -> admit -> download -> verify -> publish, plus pins, refs, GC.

Used by the CLI (one-shot) and by the node agent (long-running). Several processes may share
one cache root: the index is guarded by a file lock and each download by a per-key lock.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import replace

from warmfleet.agent.digests import verify_staged
from warmfleet.agent.downloader import Downloader
from warmfleet.agent.metrics import CacheMetrics
from warmfleet.agent.prefetch_failures import PrefetchFailures
from warmfleet.agent.sources.base import TransientSourceError
from warmfleet.agent.sourceset import SourceSet
from warmfleet.agent.status import (
    ArtifactStatus,
    DownloadProgress,
    WallClock,
    fetch_done_text,
    fetch_start_text,
)
from warmfleet.agent.store import Store, VerifyResult
from warmfleet.cache.capacity import EvictionPlan, occupied_bytes, plan_admission, plan_gc
from warmfleet.cache.config import NodeCacheSpec
from warmfleet.cache.index import CacheIndex
from warmfleet.cache.manifest import Manifest
from warmfleet.cache.state import ArtifactRecord, ArtifactState, record_for
from warmfleet.cache.transfer import RateMeter, TokenBucket
from warmfleet.cache.uri import parse_uri
from warmfleet.core.clock import Clock, MonotonicClock
from warmfleet.core.errors import CacheError, IntegrityError, NotFoundError, WarmfleetError

log = logging.getLogger("warmfleet.agent.cache")
FillHook = Callable[..., Callable[..., Awaitable[dict[str, dict[str, str]]]] | None]
IN_PROGRESS = frozenset({ArtifactState.PENDING, ArtifactState.DOWNLOADING, ArtifactState.VERIFYING})
LOCK_POLL_S = 0.2
CANCELLED = "cancelled (staged data kept)"


class DownloadLockTimeoutError(CacheError):
    """Another process held an artifact's download lock longer than
    ``download.lock_wait_timeout_s`` (a hung holder); the caller may try again later."""


class DownloadFailedError(CacheError):
    """A download failed after admission with an error that is not one of the cache's own (an
    OSError, a bug in a source): the artifact is ``failed`` with the reason, its reservation
    released and its staged data discarded."""


class CacheManager:
    def __init__(
        self,
        store: Store,
        spec: NodeCacheSpec,
        sources: SourceSet,
        *,
        metrics: CacheMetrics | None = None,
        wall: Clock | None = None,
        mono: Clock | None = None,
        free_bytes_fn: Callable[[], int] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.spec = spec
        self.policy = spec.capacity.policy()
        self.sources = sources
        self.metrics = metrics or CacheMetrics()
        self._wall = wall or WallClock()
        self._mono = mono or MonotonicClock()
        self._free_bytes = free_bytes_fn or store.free_bytes
        self._rng = rng or random.Random(0)
        limit = spec.download.bandwidth_limit
        self._limiter = TokenBucket(self._mono, limit) if limit else None
        self._live: dict[str, ArtifactStatus] = {}
        self._logged: set[tuple[str, str]] = set()  # (key, reason) already logged with a trace
        self.failures = PrefetchFailures(self.metrics, self._wall)  # of held prefetches
        self.fill_hook: FillHook | None = None  # (manifest, on_bytes) -> a fill, e.g. a peer fill
        self.metrics.budget_bytes.set(self.policy.budget_bytes)

    # ----- resolve / prefetch ---------------------------------------------------------------
    async def resolve(self, uri: str, revision: str | None = None) -> Manifest:
        parsed = parse_uri(uri)
        return await self.sources.get(parsed.kind).resolve(parsed, revision)

    async def prefetch(
        self,
        uri: str,
        *,
        revision: str | None = None,
        name: str | None = None,
        holder: str | None = None,
        pin: bool = False,
    ) -> ArtifactRecord:
        manifest = await self.resolve(uri, revision)
        return await self.ensure(manifest, name or parse_uri(uri).default_name(), holder, pin)

    async def ensure(
        self, manifest: Manifest, name: str, holder: str | None = None, pin: bool = False
    ) -> ArtifactRecord:
        key = manifest.key()
        done = self._admit(manifest, name, holder, pin)
        if done is not None:
            return done
        timeout_s = self.spec.download.lock_wait_timeout_s
        deadline_s = self._mono.now_s() + timeout_s
        while True:
            with self.store.download_lock(key, blocking=False) as got:
                if got:
                    return await self._fill(manifest, name, holder, pin)
            if self._mono.now_s() >= deadline_s:
                raise DownloadLockTimeoutError(
                    f"artifact {name} ({key[:16]}): another process has held its download "
                    f"lock for more than {timeout_s:g} s (download.lock_wait_timeout_s); "
                    f"gave up waiting"
                )
            await asyncio.sleep(LOCK_POLL_S)  # another process is downloading this key
            rec = self.store.read_index().get(key)
            if rec is not None and rec.state == ArtifactState.READY:
                return self._settle(key, name, holder)

    def _admit(
        self, manifest: Manifest, name: str, holder: str | None, pin: bool
    ) -> ArtifactRecord | None:
        key, now = manifest.key(), self._wall.now_s()
        with self.store.index_txn() as idx:
            rec = idx.get(key)
            if rec is not None and rec.state == ArtifactState.READY:
                if self.store.is_published(key):
                    self._hold(idx, key, holder, pin, now)
                    if holder:  # e.g. a rollback to a version still on disk
                        self._roll_over(idx, key, name, holder)
                    return idx.get(key)
                idx.set_state(key, ArtifactState.FAILED, "published directory vanished")
            records, staged = self.store.planning_view(idx)
            plan = plan_admission(
                records,
                staged_bytes=staged,
                key=key,
                name=name,
                size_bytes=manifest.size_bytes,
                disk_free_bytes=self._free_for_admission(idx, key, manifest.size_bytes),
                policy=self.policy,
            )
            self._evict(idx, plan)
            cur = idx.get(key)
            if cur is None:
                idx.put(record_for(manifest, name, now))
            elif cur.state == ArtifactState.FAILED:
                idx.set_state(key, ArtifactState.PENDING)
            self._hold(idx, key, holder, pin, now)
            self._update_gauges(idx)
        return None

    def _hold(self, idx: CacheIndex, key: str, holder: str | None, pin: bool, now: float) -> None:
        idx.touch(key, now)
        if holder:
            idx.add_ref(key, holder)
        if pin:
            idx.set_pinned(key, True)

    def _free_for_admission(self, idx: CacheIndex, new_key: str, new_size_bytes: int) -> int:
        """File system free space minus what other in-flight downloads still must write, plus
        what the new artifact already has staged (a resumed download reuses it)."""
        outstanding = sum(
            max(r.size_bytes - self.store.staged_bytes(r.key), 0)
            for r in idx
            if r.state in IN_PROGRESS and r.key != new_key
        )
        own = min(self.store.staged_bytes(new_key), new_size_bytes)
        return self._free_bytes() - outstanding + own

    def _evict(self, idx: CacheIndex, plan: EvictionPlan) -> None:
        for rec in idx.check_evictions(plan):
            self.store.delete_object(rec.key)
            idx.remove(rec.key)
            self.metrics.evictions.inc()
            self.metrics.evicted_bytes.inc(rec.size_bytes)
        for key in plan.discard:  # failed downloads: their staged data goes with the record
            self.store.discard_staging(key)
            idx.remove(key)

    def _set_state(self, key: str, state: ArtifactState, reason: str = "") -> None:
        with self.store.index_txn() as idx:
            if idx.get(key) is not None:
                idx.set_state(key, state, reason)
            self._update_gauges(idx)
        live = self._live.get(key)
        if live is not None:
            live.state, live.reason = state, reason
            if state in (ArtifactState.READY, ArtifactState.FAILED):
                live.finished_at = self._wall.now_s()

    async def _fill(
        self, manifest: Manifest, name: str, holder: str | None, pin: bool
    ) -> ArtifactRecord:
        key = manifest.key()
        rec = self.store.read_index().get(key)
        if rec is not None and rec.state == ArtifactState.READY and self.store.is_published(key):
            return self._settle(key, name, holder)  # another process filled it meanwhile
        if rec is None or rec.state == ArtifactState.FAILED:
            # another process failed (or GC dropped its record) while we waited for the lock
            done = self._admit(manifest, name, holder, pin)
            if done is not None:
                return done
        status = ArtifactStatus.starting(manifest, name, self._wall.now_s())
        self._live[key] = status
        started = self._mono.now_s()
        kind = manifest.kind.value
        log.info("%s", fetch_start_text(name, manifest))
        try:
            await self._download_and_verify(manifest, status)
        except WarmfleetError as err:
            if not isinstance(err, TransientSourceError):
                self.store.discard_staging(key)  # resumable faults keep their staging data
            self._set_state(key, ArtifactState.FAILED, f"{type(err).__name__}: {err}")
            self.metrics.downloads.labels(kind, "failed").inc()
            raise
        except asyncio.CancelledError:
            # Stopped (unassigned, shutdown, Ctrl-C): not in progress any more, so its space is
            # not reserved and GC may drop it; the staged data stays for a resume.
            self._set_state(key, ArtifactState.FAILED, CANCELLED)
            raise
        except Exception as err:  # anything else must not leave it "downloading" forever
            raise self._failed_unexpectedly(key, name, kind, err) from err
        self.metrics.downloads.labels(kind, "ok").inc()
        took_s = self._mono.now_s() - started
        self.metrics.download_seconds.labels(kind).observe(took_s)
        log.info("%s", fetch_done_text(name, manifest, took_s, self.store.object_dir(key)))
        return self._settle(key, name, holder)

    def _failed_unexpectedly(
        self, key: str, name: str, kind: str, err: Exception
    ) -> DownloadFailedError:
        """Fail the artifact (releasing its reservation) and log the traceback once per
        artifact and reason: a retry at every reconcile does not log it again."""
        reason = f"{type(err).__name__}: {err}"
        self.store.discard_staging(key)
        self._set_state(key, ArtifactState.FAILED, reason)
        self.metrics.downloads.labels(kind, "failed").inc()
        if (key, reason) not in self._logged:
            self._logged.add((key, reason))
            log.error("download of %s (%s) failed: %s", name, key[:16], reason, exc_info=err)
        return DownloadFailedError(f"artifact {name} ({key[:16]}) failed: {reason}")

    def _settle(self, key: str, name: str, holder: str | None) -> ArtifactRecord:
        """``key`` is ready: the holder moves to it from older versions of ``name``."""
        with self.store.index_txn() as idx:
            if holder:
                self._roll_over(idx, key, name, holder)
            out = idx.get(key)
        if out is None:
            raise NotFoundError(f"artifact {name} ({key[:16]}) vanished from the index")
        return out

    def _roll_over(self, idx: CacheIndex, key: str, name: str, holder: str) -> None:
        """An update: the holder now uses ``key``; older versions of ``name`` lose the ref."""
        for other in list(idx):
            if other.key != key and other.name == name and holder in other.refs:
                idx.drop_ref(other.key, holder)

    async def _download_and_verify(self, manifest: Manifest, status: ArtifactStatus) -> None:
        key = manifest.key()
        source = self.sources.get(manifest.kind)
        progress = DownloadProgress(
            status, RateMeter(self._mono, manifest.size_bytes), self.metrics, manifest.kind.value
        )
        attempts = self.spec.download.verify_attempts
        for attempt in range(1, attempts + 1):
            progress.meter.done_bytes = 0
            staging = await asyncio.to_thread(self.store.prepare_staging, manifest)
            self._set_state(key, ArtifactState.DOWNLOADING)
            fill = self.fill_hook(manifest, progress.on_bytes) if self.fill_hook else None
            downloader = Downloader(
                self.spec.download,
                self._mono,
                limiter=self._limiter,
                rng=self._rng,
                on_bytes=progress.on_bytes,
                on_retry=progress.on_retry,
            )
            try:  # a local copy compares as it goes: its IntegrityError comes from download
                if fill is None:
                    await downloader.download(source, manifest, staging)
                inline = await fill(source, manifest, staging) if fill else downloader.digests
                self._set_state(key, ArtifactState.VERIFYING)
                staged = self.store.staging_dir(key)
                digests = await verify_staged(staged, manifest, inline)
            except IntegrityError:
                self.metrics.integrity_failures.inc()
                self.store.discard_staging(key)
                if attempt == attempts:
                    raise
                progress.on_retry("IntegrityError")
                continue
            await asyncio.to_thread(self.store.publish, manifest, digests, self._wall.now_s())
            self._set_state(key, ArtifactState.READY)
            return

    # ----- queries / admin --------------------------------------------------------------------
    def records(self) -> list[ArtifactRecord]:
        return list(self.store.read_index())

    def statuses(self, records: list[ArtifactRecord] | None = None) -> list[ArtifactStatus]:
        out = []
        for rec in self.records() if records is None else records:
            live = self._live.get(rec.key)
            if live is not None:
                out.append(replace(live, state=rec.state, reason=rec.reason or live.reason))
                continue
            done = rec.size_bytes if rec.state == ArtifactState.READY else 0
            if rec.state in IN_PROGRESS:
                done = min(self.store.staged_bytes(rec.key), rec.size_bytes)
            out.append(
                ArtifactStatus(
                    rec.key,
                    rec.name,
                    rec.uri,
                    rec.state,
                    done,
                    rec.size_bytes,
                    reason=rec.reason,
                )
            )
        return out

    def live(self) -> list[ArtifactStatus]:
        """Downloads this process started (for progress bars)."""
        return list(self._live.values())

    def status_of(self, key: str) -> ArtifactStatus | None:
        return next((s for s in self.statuses() if s.key == key), None)

    def set_pinned(self, key_or_name: str, pinned: bool) -> ArtifactRecord:
        with self.store.index_txn() as idx:
            rec = idx.resolve(key_or_name)
            return idx.set_pinned(rec.key, pinned)

    def add_ref(self, key_or_name: str, holder: str) -> ArtifactRecord:
        with self.store.index_txn() as idx:
            return idx.add_ref(idx.resolve(key_or_name).key, holder)

    def drop_ref(self, key_or_name: str, holder: str) -> ArtifactRecord:
        with self.store.index_txn() as idx:
            return idx.drop_ref(idx.resolve(key_or_name).key, holder)

    def gc(self, *, evict_all_unreferenced: bool = False) -> EvictionPlan:
        """Watermark GC (or everything evictable). Failed downloads nobody holds or pins are
        dropped with their staged data; wanted ones keep it for a resume unless space is
        needed (``cache.capacity.plan_gc``). One another process is retrying is left alone."""
        with self.store.index_txn() as idx:
            records, staged = self.store.planning_view(idx)
            plan = plan_gc(
                records,
                disk_free_bytes=self._free_bytes(),
                policy=self.policy,
                evict_all_unreferenced=evict_all_unreferenced,
                staged_bytes=staged,
            )
            self._evict(idx, plan)
            self._update_gauges(idx)
        return plan

    async def verify(self, *, full: bool, keys: list[str] | None = None) -> list[VerifyResult]:
        """Cheap (sizes + markers) or full (re-hash) check; failures are unpublished."""
        with self.store.index_txn() as idx:
            wanted = keys or [r.key for r in idx if r.state == ArtifactState.READY]
            self.store.adopt_orphans(idx, self._wall.now_s())
        results = []
        for key in wanted:
            res = await asyncio.to_thread(self.store.verify_published, key, full=full)
            if not res.ok:
                self.store.delete_object(key)
                self._set_state(key, ArtifactState.FAILED, f"verification failed: {res.reason}")
            results.append(res)
        return results

    def recover(self) -> None:
        """After a restart: downloads nobody holds a lock for (or that were cancelled by a
        stop) go back to pending; what interrupted deletions left is removed."""
        self.store.sweep_deleting()
        with self.store.index_txn() as idx:
            for rec in list(idx):
                stopped = rec.state == ArtifactState.FAILED and rec.reason == CANCELLED
                if (rec.state in IN_PROGRESS or stopped) and not self.store.is_locked(rec.key):
                    idx.put(replace(rec, state=ArtifactState.PENDING, reason=""))
            self._update_gauges(idx)

    def _update_gauges(self, idx: CacheIndex) -> None:
        self.metrics.used_bytes.set(occupied_bytes(idx))
        self.metrics.free_bytes.set(self._free_bytes())
        for state in ArtifactState:
            self.metrics.artifacts.labels(state.value).set(sum(1 for r in idx if r.state == state))
