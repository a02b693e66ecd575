"""Named views of published caches: ``<root>/<cache>/``, what engine pods read.

An engine pod mounts the node's cache directory and reads ``$WARMFLEET_MODEL_DIR`` =
``<mount>/<cache>`` when ``<mount>/<cache>/.warmfleet-ready`` exists (else it loads from the
origin). So for each usable assigned cache the agent makes ``<root>/<cache>/``: one *relative*
symbolic link per top-level entry of the published object (``../objects/<key>/<entry>``, valid in
the pod's mount too), then the marker, written last and atomically. Unlinking removes the marker
first, so a pod never sees the marker without the files. A view whose cache moved to a new
version (a new key) is rebuilt.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from warmfleet.agent.store import MARKER as COMPLETE_MARKER
from warmfleet.agent.store import Store

READY_MARKER = ".warmfleet-ready"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a Kubernetes object name
_RESERVED = frozenset({"objects", "staging", "locks", "index.json", "agent.json"})


def valid_cache_name(name: str) -> bool:
    return bool(_NAME.match(name)) and name not in _RESERVED and ".." not in name


def _is_view(path: Path) -> bool:
    """A directory this agent made: nothing in it but links and its marker (also one a crash
    left half-built). Anything else under the root is not the agent's to delete."""
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        return all(
            e.is_symlink() or e.name in (READY_MARKER, READY_MARKER + ".tmp")
            for e in path.iterdir()
        )
    except OSError:
        return False


class CacheLinks:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = store.root

    def linked_key(self, cache: str) -> str | None:
        """The object key the view of ``cache`` shows (``None``: no complete view)."""
        try:
            data = json.loads((self.root / cache / READY_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        key = data.get("key") if isinstance(data, dict) else None
        return key if isinstance(key, str) else None

    def link(self, cache: str, key: str) -> None:
        """Make ``<root>/<cache>/`` show the published object ``key``."""
        if not valid_cache_name(cache):
            raise ValueError(f"not a usable cache name: {cache!r}")
        if self.linked_key(cache) == key:
            return
        self.unlink(cache)
        view = self.root / cache
        view.mkdir()
        target = self.store.object_dir(key)
        for entry in sorted(target.iterdir()):
            if entry.name != COMPLETE_MARKER:
                (view / entry.name).symlink_to(os.path.relpath(entry, view))
        tmp = view / (READY_MARKER + ".tmp")
        tmp.write_text(json.dumps({"key": key}), encoding="utf-8")
        tmp.replace(view / READY_MARKER)

    def unlink(self, cache: str) -> None:
        view = self.root / cache
        if not valid_cache_name(cache) or not _is_view(view):
            return
        (view / READY_MARKER).unlink(missing_ok=True)
        shutil.rmtree(view)  # links only: rmtree removes a link, never what it points to

    def views(self) -> list[str]:
        """Every view directory under the root (complete or left half-built by a crash)."""
        return sorted(
            p.name for p in self.root.iterdir() if valid_cache_name(p.name) and _is_view(p)
        )

    def sync(self, usable: dict[str, str]) -> None:
        """Views exactly for ``usable`` (cache -> key): build or rebuild those, drop the rest."""
        for cache in self.views():
            if cache not in usable:
                self.unlink(cache)
        for cache, key in usable.items():
            self.link(cache, key)
