"""The store's per-key download lock: exclusive, and its file lives only while it is held or
awaited (the holder unlinks it; a waiter that got the unlinked file locks the current one)."""

from __future__ import annotations

import threading
from pathlib import Path

from warmfleet.agent.store import Store


def test_lock_files_are_removed_and_exclusion_holds_across_the_unlink(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with store.download_lock("k1") as got:
        assert got
        assert store.is_locked("k1")  # another open file description is refused
        assert not store.is_locked("k2")
    assert not store.is_locked("k1")
    assert list(store.locks.iterdir()) == []

    # A waiter blocked on the file its holder unlinks must end up holding the lock on the
    # path everyone else opens, not on the unlinked file (or two could "hold" it at once).
    waiting, holding, release = threading.Event(), threading.Event(), threading.Event()

    def waiter() -> None:
        waiting.set()
        with store.download_lock("k1") as got_it:
            assert got_it
            holding.set()
            release.wait(10)

    with store.download_lock("k1"):
        thread = threading.Thread(target=waiter)
        thread.start()
        assert waiting.wait(10)
        assert not holding.wait(0.2)  # blocked behind us
    assert holding.wait(10)
    assert store.is_locked("k1")
    with store.download_lock("k1", blocking=False) as got:
        assert not got
    release.set()
    thread.join(10)
    assert not store.is_locked("k1")
    assert list(store.locks.iterdir()) == []
