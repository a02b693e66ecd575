"""Audit a cache root: how many published artifacts are partial or not the origin's bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

MARKER = ".warmfleet-complete.json"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(4 << 20):
            h.update(block)
    return h.hexdigest()


def published_corrupt_or_partial(root: Path, genuine_sha256: Iterable[str]) -> int:
    """Count published artifacts (``objects/<key>``) that lack a completion marker, plus
    published files whose sha256 is not one of the genuine contents the origin ever held."""
    genuine = set(genuine_sha256)
    objects = root / "objects"
    bad = 0
    for art in sorted(objects.iterdir()) if objects.exists() else []:
        if art.name.startswith("."):
            continue
        if not (art / MARKER).is_file():
            bad += 1
            continue
        for path in art.rglob("*"):
            if path.is_file() and not path.name.startswith(".warmfleet"):
                bad += sha256_of(path) not in genuine
    return bad
