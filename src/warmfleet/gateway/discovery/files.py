"""File discovery: a variant's instances come from a YAML/JSON file that is polled for changes.

One task (owned by the app lifespan) serves every variant with ``discovery: {type: file}``; it
reads the current config each tick, so reloads that add, move or drop discovery files apply on
the next tick. A file that cannot be read or validated is logged and the old instance set stays
(it is read again once it changes). A file version counts as seen only once it has been applied
or rejected: one whose instances failed past validation (a bug: logged and counted, the other
files go on) is read again at the next tick.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from warmfleet.core.config import load_yaml_text
from warmfleet.core.errors import ConfigError
from warmfleet.core.failures import one_line
from warmfleet.gateway.config import parse_instance_list
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.gateway.world import GatewayState

log = logging.getLogger(__name__)
_MIN_TICK_S = 0.05


class FileDiscovery:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        # (endpoint, variant, path) -> (mtime_ns, size) of the last file version seen
        self._seen: dict[tuple[str, str, str], tuple[int, int]] = {}
        self.loads = 0
        self.errors = 0

    def tick_s(self) -> float:
        intervals = [
            v.discovery.poll_interval_s for v in self.state.variants() if v.discovery is not None
        ]
        return max(_MIN_TICK_S, min(intervals, default=1.0))

    async def run(self) -> None:
        while True:
            try:
                self.scan()
            except Exception:  # a bug: logged, and the next change of a file is still read
                self.errors += 1
                log.exception("file discovery: a scan failed; the old instances stay")
            await asyncio.sleep(self.tick_s())

    def scan(self) -> None:
        """Load every discovery file that changed since it was last seen."""
        live: set[tuple[str, str, str]] = set()
        for variant in self.state.variants():
            disc = variant.discovery
            if disc is None:
                continue
            key = (variant.endpoint, variant.name, disc.path)
            live.add(key)
            try:
                self._scan_one(variant, key, Path(disc.path))
            except Exception:  # a bug: logged; this file is read again, the others go on
                self.errors += 1
                self.state.metrics.reloads.labels("discovery", "error").inc()
                log.exception("discovery file %s not applied; the old instances stay", disc.path)
        for stale in set(self._seen) - live:
            del self._seen[stale]

    def _scan_one(self, variant: VariantRuntime, key: tuple[str, str, str], path: Path) -> None:
        try:
            stat = os.stat(path)
        except OSError as err:
            if self._seen.get(key) != (-1, -1):
                log.warning(
                    "discovery file %s unreadable: %s; keeping %d instances",
                    path,
                    err,
                    len(variant.instances),
                )
                self._seen[key] = (-1, -1)
                self.errors += 1
            return
        version = (stat.st_mtime_ns, stat.st_size)
        if self._seen.get(key) == version:
            return
        try:
            text = path.read_text(encoding="utf-8")
            listing = parse_instance_list(load_yaml_text(text, str(path)), str(path))
        except (OSError, UnicodeDecodeError, ConfigError) as err:
            self._seen[key] = version  # rejected: logged once, read again when it changes
            self.errors += 1
            self.state.metrics.reloads.labels("discovery", "error").inc()
            why = one_line(str(err))
            log.error("discovery file %s rejected, keeping the old instances: %s", path, why)
            return
        variant.set_instances(listing.instances)
        self._seen[key] = version  # only once applied
        self.loads += 1
        self.state.metrics.reloads.labels("discovery", "ok").inc()
        log.info("discovery %s: %d instances for %s/%s", path, len(listing.instances), *key[:2])
