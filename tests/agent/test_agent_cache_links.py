"""``CacheLinks``: the ``<root>/<cache>/`` views that engine pods read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warmfleet.agent.cache_links import READY_MARKER, CacheLinks, valid_cache_name
from warmfleet.agent.store import MARKER, Store


def publish(store: Store, key: str, files: dict[str, bytes]) -> None:
    """A published object as the store leaves it: files, subdirectories, the completion marker."""
    target = store.object_dir(key)
    for rel, data in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    (target / MARKER).write_text("{}")


def test_view_shows_the_object_then_follows_a_new_version_then_goes(tmp_path: Path) -> None:
    store = Store(tmp_path)
    links = CacheLinks(store)
    publish(store, "k1", {"config.json": b"{1}", "weights/part-0.bin": b"v1"})
    publish(store, "k2", {"config.json": b"{2}", "weights/part-0.bin": b"v2"})
    view = tmp_path / "llama-w-1"

    links.sync({"llama-w-1": "k1"})
    assert links.linked_key("llama-w-1") == "k1"
    assert (view / "config.json").read_bytes() == b"{1}"
    assert (view / "weights" / "part-0.bin").read_bytes() == b"v1"
    assert sorted(p.name for p in view.iterdir()) == [READY_MARKER, "config.json", "weights"]
    assert all(not os.path.isabs(os.readlink(view / n)) for n in ("config.json", "weights"))

    links.sync({"llama-w-1": "k2"})  # a new version of the same cache: the view is rebuilt
    assert links.linked_key("llama-w-1") == "k2"
    assert (view / "weights" / "part-0.bin").read_bytes() == b"v2"

    (tmp_path / "half-built").mkdir()  # a view a crash left without its marker
    assert links.views() == ["half-built", "llama-w-1"]
    links.sync({})
    assert links.views() == []
    assert (store.object_dir("k2") / "config.json").read_bytes() == b"{2}"  # data untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locks", "objects", "staging"]


def test_names_that_are_not_views(tmp_path: Path) -> None:
    links = CacheLinks(Store(tmp_path))
    for bad in ("objects", "staging", "locks", "index.json", "../etc", "a/b", "Upper", ""):
        assert not valid_cache_name(bad)
        with pytest.raises(ValueError, match="cache name"):
            links.link(bad, "k1")
    links.unlink("objects")  # never touches the store's own directories
    assert (tmp_path / "objects").is_dir()
    assert links.views() == []


def test_a_directory_that_is_not_a_view_is_never_deleted(tmp_path: Path) -> None:
    """A root shared with other data: a directory with a cache-like name holding real files is
    not the agent's (``sync`` removed every directory it did not want, ``rmtree`` and all)."""
    links = CacheLinks(Store(tmp_path))
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    (datasets / "train.parquet").write_bytes(b"rows")
    links.sync({})
    links.unlink("datasets")
    assert (datasets / "train.parquet").read_bytes() == b"rows"
    assert links.views() == []
