"""Hugging Face Hub source against a local HF-compatible server given as HF_ENDPOINT."""

from __future__ import annotations

import os

import pytest
from cache_support import manager_for
from huggingface_hub import hf_hub_download

from warmfleet.cache.config import SourcesSpec
from warmfleet.core.errors import IntegrityError, NotFoundError

WEIGHTS = os.urandom(700_000)
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": WEIGHTS}


async def test_hf_prefetch_pins_commit_and_verifies(origin, tmp_path, monkeypatch):
    org, url = origin
    repo = org.put_repo("org/tiny", FILES, lfs={"model.safetensors"})
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    async with manager_for(tmp_path / "c") as m:
        rec = await m.prefetch("hf://org/tiny")  # revision defaults to main
        assert rec.extra["revision"] == repo.commit
        obj = tmp_path / "c" / "objects" / rec.key
        assert (obj / "model.safetensors").read_bytes() == WEIGHTS
        assert (obj / "config.json").read_bytes() == FILES["config.json"]
        manifest = m.store.read_marker(rec.key)["manifest"]
        files = {f["path"]: f for f in manifest["files"]}
        assert files["model.safetensors"]["sha256"]  # LFS sha256
        assert files["config.json"]["git_sha1"]  # git blob id, verified too
        assert f"/resolve/{repo.commit}/model.safetensors" in files["model.safetensors"]["locator"]
        same = await m.prefetch("hf://org/tiny", revision=repo.commit)
        assert same.key == rec.key
        with pytest.raises(NotFoundError):
            await m.prefetch("hf://org/tiny", revision="f" * 40)
    assert set(org.auth_seen) == {"Bearer hf_test_token"}
    assert any("blobs=true" in r for r in org.requests)


async def test_hf_token_from_file_and_new_commit_is_new_version(origin, tmp_path, monkeypatch):
    org, url = origin
    org.put_repo("org/tiny", FILES, lfs={"model.safetensors"})
    monkeypatch.delenv("HF_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("hf_from_file\n")
    sources = SourcesSpec(
        hf_endpoint=url, hf_token_env="WF_NO_SUCH_VAR", hf_token_file=str(token_file)
    )
    async with manager_for(tmp_path / "c", sources=sources) as m:
        first = await m.prefetch("hf://org/tiny", name="tiny", holder="dep")
        org.put_repo(
            "org/tiny",
            {**FILES, "config.json": b'{"model_type": "tiny2"}'},
            lfs={"model.safetensors"},
        )
        second = await m.prefetch("hf://org/tiny", name="tiny", holder="dep")
        assert second.key != first.key
        assert second.extra["revision"] != first.extra["revision"]
    assert set(org.auth_seen) == {"Bearer hf_from_file"}


async def test_hf_corrupt_lfs_object_is_not_published(origin, tmp_path, monkeypatch):
    org, url = origin
    repo = org.put_repo("org/tiny", FILES, lfs={"model.safetensors"})
    repo.files["model.safetensors"].flip = True
    monkeypatch.setenv("HF_ENDPOINT", url)
    async with manager_for(tmp_path, verify_attempts=1) as m:
        with pytest.raises(IntegrityError):
            await m.prefetch("hf://org/tiny")
    assert not any((tmp_path / "objects").iterdir())


def test_server_speaks_what_huggingface_hub_requests(origin, tmp_path):
    """The fake hub is faithful enough for huggingface_hub's own downloader."""
    org, url = origin
    repo = org.put_repo("org/tiny", FILES, lfs={"model.safetensors"})
    path = hf_hub_download(
        "org/tiny",
        "model.safetensors",
        revision="main",
        endpoint=url,
        cache_dir=tmp_path / "hub",
        token=False,
    )
    with open(path, "rb") as fh:
        assert fh.read() == WEIGHTS
    assert repo.commit in path
