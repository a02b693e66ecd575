"""File names a manifest may list: what the store can create under its staging directory,
checked when the manifest is built (at resolve, before admission)."""

from __future__ import annotations

import pytest
from aiohttp import web

from warmfleet.agent.peer_serve import _safe_rel
from warmfleet.cache.manifest import FileEntry, Manifest, ManifestError, SourceKind


def _manifest(*paths: str, mode: int | None = None) -> Manifest:
    files = tuple(FileEntry(p, 1, f"loc/{i}", mode=mode) for i, p in enumerate(paths))
    return Manifest(SourceKind.HTTP, "http://o/m", files)


@pytest.mark.parametrize(
    "path",
    [
        "w\0.bin",  # NUL
        "x" * 256,  # one component over NAME_MAX
        "d/" + "é" * 128,  # 256 bytes in UTF-8
        "/".join(["d" * 200] * 6),  # a path over 1024 bytes
        "",
        "/abs",
        "a//b",
        "a/./b",
        "..",
        "../x",
        "a/../../x",
        "a\\b",
        "sub/.warmfleet-complete.json",
        ".warmfleet-complete.json/x",  # a directory clashing with the store's marker
        "a/.warmfleet-progress.json/b",
        "\udcff",  # not UTF-8 (a surrogate from a non-UTF-8 file name)
    ],
)
def test_unusable_names_are_refused(path: str) -> None:
    with pytest.raises(ManifestError):
        _manifest(path)


@pytest.mark.parametrize(
    "paths",
    [("a", "a/b"), ("a/b/c", "a/b"), ("x/y", "x/y/z/w", "q")],
)
def test_a_name_that_is_both_file_and_directory_is_refused(paths: tuple[str, ...]) -> None:
    with pytest.raises(ManifestError, match="both a file and a directory"):
        _manifest(*paths)


def test_usable_names_pass() -> None:
    names = ("x" * 255, "d/" + "é" * 127, "a/b", "a/c/d", "ab", "a.b/c", ".gitattributes")
    assert len(_manifest(*names).files) == len(names)


@pytest.mark.parametrize("path", ["..data/w.bin", "a/..b", "x.warmfleet", "ok/w.bin"])
def test_a_peer_serves_every_name_a_manifest_allows(path: str) -> None:
    """A peer refused some names manifests allow (``..data``): the node asking dropped that
    peer for its whole fill. Both now apply ``check_relpath``."""
    _manifest(path)
    assert _safe_rel(path) == path


@pytest.mark.parametrize("path", ["../x", ".warmfleet-complete.json", "a/.warmfleet-x/b", "w\0"])
def test_a_peer_refuses_what_no_manifest_names(path: str) -> None:
    with pytest.raises(web.HTTPNotFound):
        _safe_rel(path)


def test_mode_is_identity_when_known_and_checked() -> None:
    assert _manifest("f", mode=0o600).key() != _manifest("f", mode=0o644).key()
    assert "mode" not in FileEntry("f", 1, "l").identity()  # other sources: keys unchanged
    with pytest.raises(ManifestError, match="bad mode"):
        _manifest("f", mode=0o10000)
