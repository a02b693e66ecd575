"""Image pre-pull from Debian's docker-registry on 127.0.0.1, with images pushed by the test."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cache_support import manager_for

from harness.registry import ensure_registry_installed, push_image, run_registry
from warmfleet.core.errors import IntegrityError


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    binary = ensure_registry_installed()
    if binary is None:
        pytest.skip(
            "docker-registry is not installed and `apt-get install -y docker-registry` failed"
        )
    work = tmp_path_factory.mktemp("registry")
    with run_registry(work, binary) as addr:
        yield addr, work / "data"


def _layout_ok(root: Path) -> None:
    assert json.loads((root / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    for blob in (root / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name


async def test_prepull_single_manifest_image(registry: tuple[str, Path], tmp_path: Path) -> None:
    addr, _ = registry
    image = push_image(
        addr,
        repo="demo/app",
        tag="v1",
        layers=[{"bin/app": os.urandom(200_000)}, {"etc/conf": b"x"}],
    )
    async with manager_for(tmp_path) as m:
        rec = await m.prefetch(f"oci://{image.ref}", holder="deploy/vllm")
        assert rec.extra["digest"] == image.digest
        assert rec.refs == {"deploy/vllm"}
        root = tmp_path / "objects" / rec.key
        _layout_ok(root)
        index = json.loads((root / "index.json").read_text())
        assert index["manifests"][0]["digest"] == image.digest
        assert len(list((root / "blobs" / "sha256").iterdir())) == 4  # manifest, config, 2 layers
        by_digest = await m.prefetch(f"oci://{addr}/demo/app@{image.digest}")
        assert by_digest.extra["digest"] == image.digest
        # referenced while a deployment uses it: GC keeps it
        assert rec.key not in m.gc(evict_all_unreferenced=True).evict


async def test_prepull_follows_image_index_to_platform(
    registry: tuple[str, Path], tmp_path: Path
) -> None:
    addr, _ = registry
    image = push_image(
        addr,
        repo="demo/multi",
        tag="v2",
        layers=[{"a": os.urandom(50_000)}],
        platforms=("linux/arm64", "linux/amd64"),
        index=True,
    )
    async with manager_for(tmp_path) as m:
        rec = await m.prefetch(f"oci://{image.ref}")
        assert rec.extra["digest"] == image.manifest_digests["linux/amd64"]
        assert rec.extra["index_digest"] == image.digest
        _layout_ok(tmp_path / "objects" / rec.key)


async def test_corrupt_blob_in_registry_is_detected(
    registry: tuple[str, Path], tmp_path: Path
) -> None:
    addr, data_dir = registry
    layer = os.urandom(100_000)
    image = push_image(addr, repo="demo/rot", tag="v1", layers=[{"f": layer}])
    manifest = json.loads(
        next(
            p
            for p in data_dir.rglob("data")
            if p.stat().st_size < 4096
            and b'"layers"' in p.read_bytes()
            and hashlib.sha256(p.read_bytes()).hexdigest() == image.digest[7:]
        ).read_bytes()
    )
    digest = manifest["layers"][0]["digest"][7:]
    blob_file = data_dir / "docker/registry/v2/blobs/sha256" / digest[:2] / digest / "data"
    raw = bytearray(blob_file.read_bytes())
    raw[10] ^= 0xFF
    blob_file.write_bytes(bytes(raw))  # bit rot at the origin
    async with manager_for(tmp_path, verify_attempts=1) as m:
        with pytest.raises(IntegrityError):
            await m.prefetch(f"oci://{image.ref}")
    assert not any((tmp_path / "objects").iterdir())
