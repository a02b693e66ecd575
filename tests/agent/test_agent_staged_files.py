"""The bounded pool of staged files: never more descriptors than the bound (plus those in use),
every write fsynced by ``sync()`` even after its descriptor was closed, modes never wider."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from warmfleet.agent.staged_files import StagedFiles, published_mode, staging_mode


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_descriptors_stay_bounded_and_writes_are_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = StagedFiles(tmp_path, max_open=3)
    before = _open_fds()
    for i in range(50):
        files.create(f"d/f{i}", 10, mode=0o600, preallocate=False)

        def write_index(fd: int, i: int = i) -> int:
            return os.pwrite(fd, b"%02d" % i, 0)

        files.run(f"d/f{i}", write_index, write=True)
        assert files.open_count <= 3
        assert _open_fds() - before <= 3
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    files.sync()
    assert len(synced) == 50  # 3 still open + 47 closed meanwhile, each reopened to be fsynced
    synced.clear()
    files.sync()
    assert synced == []  # nothing written since
    files.close()
    assert _open_fds() == before
    assert (tmp_path / "d" / "f7").read_bytes()[:2] == b"07"


def test_a_descriptor_in_use_is_never_closed_under_its_user(tmp_path: Path) -> None:
    files = StagedFiles(tmp_path, max_open=1)
    files.create("a", 4, mode=0o600, preallocate=False)
    inside, release = threading.Event(), threading.Event()

    def slow_write(fd: int) -> int:
        inside.set()
        release.wait(10)
        return os.pwrite(fd, b"late", 0)  # fd still valid although close() ran meanwhile

    worker = threading.Thread(target=lambda: files.run("a", slow_write, write=True))
    worker.start()
    assert inside.wait(10)
    files.close()
    release.set()
    worker.join(10)
    assert (tmp_path / "a").read_bytes() == b"late"
    with pytest.raises(OSError, match="closed"):
        files.run("a", lambda fd: fd, write=False)


def test_modes_are_never_wider_than_the_source() -> None:
    assert [published_mode(m) for m in (0o600, 0o640, 0o755, 0o444, 0o000, None)] == [
        0o600,
        0o640,
        0o644,
        0o444,
        0o400,
        0o644,
    ]
    assert staging_mode(0o444) == 0o644
    assert staging_mode(0o000) == 0o600
