"""S3 source against moto's ThreadedMotoServer on 127.0.0.1 (boto3 with endpoint_url)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from cache_support import manager_for, published_corrupt_or_partial
from moto.server import ThreadedMotoServer

from warmfleet.cache.config import SourcesSpec
from warmfleet.cache.state import ArtifactState
from warmfleet.core.errors import NotFoundError


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    for var, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(var, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # boto3 builds its clients at run time and ships no types: the client is untyped
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="models")
    try:
        yield client, endpoint
    finally:
        server.stop()


@pytest.mark.slow
async def test_s3_prefix_prefetch_verifies_md5_and_checksums(
    s3: tuple[Any, str], tmp_path: Path
) -> None:
    client, endpoint = s3
    weights, cfg = os.urandom(600_000), b'{"a": 1}'
    client.put_object(Bucket="models", Key="llm/model.bin", Body=weights)
    client.put_object(
        Bucket="models", Key="llm/sub/config.json", Body=cfg, ChecksumAlgorithm="SHA256"
    )
    sources = SourcesSpec(s3_endpoint_url=endpoint)
    async with manager_for(tmp_path, sources=sources) as m:
        rec = await m.prefetch("s3://models/llm/")
        obj = tmp_path / "objects" / rec.key
        assert (obj / "model.bin").read_bytes() == weights
        assert (obj / "sub" / "config.json").read_bytes() == cfg
        files = {f["path"]: f for f in m.store.read_marker(rec.key)["manifest"]["files"]}
        assert files["model.bin"]["md5"] == hashlib.md5(weights).hexdigest()
        assert files["sub/config.json"]["sha256"] == hashlib.sha256(cfg).hexdigest()
        single = await m.prefetch("s3://models/llm/model.bin")
        assert single.key != rec.key
        with pytest.raises(NotFoundError):
            await m.prefetch("s3://models/nothing-here")


async def test_s3_multipart_object_gets_sha256_recorded(
    s3: tuple[Any, str], tmp_path: Path
) -> None:
    client, endpoint = s3
    part1, part2 = os.urandom(5 * 1024 * 1024), os.urandom(1000)
    up = client.create_multipart_upload(Bucket="models", Key="mp.bin")
    etags = [
        client.upload_part(
            Bucket="models", Key="mp.bin", PartNumber=i, UploadId=up["UploadId"], Body=b
        )["ETag"]
        for i, b in ((1, part1), (2, part2))
    ]
    client.complete_multipart_upload(
        Bucket="models",
        Key="mp.bin",
        UploadId=up["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": i + 1} for i, e in enumerate(etags)]},
    )
    async with manager_for(
        tmp_path, sources=SourcesSpec(s3_endpoint_url=endpoint), chunk=2 << 20
    ) as m:
        rec = await m.prefetch("s3://models/mp.bin")
        entry = m.store.read_marker(rec.key)
        assert entry["manifest"]["files"][0]["md5"] is None  # multipart ETag is no md5
        assert entry["digests"]["mp.bin"]["sha256"] == hashlib.sha256(part1 + part2).hexdigest()


async def test_s3_object_replaced_in_place_is_a_new_version(
    s3: tuple[Any, str], tmp_path: Path
) -> None:
    client, endpoint = s3
    client.put_bucket_versioning(Bucket="models", VersioningConfiguration={"Status": "Enabled"})
    v1, v2 = os.urandom(300_000), os.urandom(300_000)
    client.put_object(Bucket="models", Key="m/w.bin", Body=v1)
    async with manager_for(tmp_path, sources=SourcesSpec(s3_endpoint_url=endpoint)) as m:
        old = await m.prefetch("s3://models/m/", name="m", holder="dep")
        old_manifest = m.store.read_marker(old.key)["manifest"]
        assert old_manifest["files"][0]["version_id"]
        client.put_object(Bucket="models", Key="m/w.bin", Body=v2)
        new = await m.prefetch("s3://models/m/", name="m", holder="dep")
        assert new.key != old.key
        recs = {r.key: r for r in m.records()}
        assert recs[old.key].state == ArtifactState.READY
        assert not recs[old.key].refs
        assert m.gc(evict_all_unreferenced=True).evict == (old.key,)
    assert published_corrupt_or_partial(tmp_path, {"v1": v1, "v2": v2}) == 0
