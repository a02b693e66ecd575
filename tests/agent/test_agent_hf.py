"""Hugging Face Hub source against a local HF-compatible server given as HF_ENDPOINT."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cache_support import manager_for
from huggingface_hub import hf_hub_download

from harness.origin import Origin, ServerThread
from warmfleet.agent.sources.base import SourceError, TransientSourceError
from warmfleet.agent.sources.hf import HfSource
from warmfleet.agent.sources.http import HttpSource
from warmfleet.cache.config import SourcesSpec
from warmfleet.cache.manifest import FileEntry
from warmfleet.core.errors import IntegrityError, NotFoundError
from warmfleet.edge import free_port

WEIGHTS = os.urandom(700_000)
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": WEIGHTS}


async def test_hf_prefetch_pins_commit_and_verifies(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


async def test_hf_token_from_file_and_new_commit_is_new_version(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


async def test_hf_corrupt_lfs_object_is_not_published(
    origin: tuple[Origin, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    org, url = origin
    repo = org.put_repo("org/tiny", FILES, lfs={"model.safetensors"})
    repo.files["model.safetensors"].flip = True
    monkeypatch.setenv("HF_ENDPOINT", url)
    async with manager_for(tmp_path, verify_attempts=1) as m:
        with pytest.raises(IntegrityError):
            await m.prefetch("hf://org/tiny")
    assert not any((tmp_path / "objects").iterdir())


def test_server_speaks_what_huggingface_hub_requests(
    origin: tuple[Origin, str], tmp_path: Path
) -> None:
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


async def test_hf_hub_unreachable_is_a_transient_source_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    async with manager_for(tmp_path / "c", request_timeout_s=5) as m:
        with pytest.raises(TransientSourceError, match="hf://org/tiny@main"):
            await m.prefetch("hf://org/tiny")


async def test_hf_hub_503_is_transient_and_403_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = {"code": 503}

    async def api(_: web.Request) -> web.Response:
        return web.Response(status=status["code"], text="busy or gated")

    def app() -> web.Application:
        application = web.Application()
        application.router.add_route("*", "/{tail:.*}", api)
        return application

    with ServerThread(app) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        async with manager_for(tmp_path / "c") as m:
            with pytest.raises(TransientSourceError, match="503"):
                await m.prefetch("hf://org/tiny")
            status["code"] = 403
            with pytest.raises(SourceError, match="403") as info:
                await m.prefetch("hf://org/tiny")
            assert not isinstance(info.value, TransientSourceError)


async def test_hf_token_is_not_sent_to_a_cdn_on_another_host(tmp_path: Path) -> None:
    """The Hub answers ``resolve`` for an LFS file with a redirect to its CDN: the ranged GET
    follows it, and the token stays with the Hub."""
    data = os.urandom(1000)
    seen: dict[str, list[str]] = {"hub": [], "cdn": []}

    async def cdn(request: web.Request) -> web.Response:
        seen["cdn"].append(request.headers.get("Authorization", ""))
        first, _, last = request.headers["Range"].removeprefix("bytes=").partition("-")
        start, end = int(first), int(last) + 1
        headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        return web.Response(status=206, body=data[start:end], headers=headers)

    def cdn_app() -> web.Application:
        application = web.Application()
        application.router.add_get("/blob", cdn)
        return application

    with ServerThread(cdn_app) as cdn_server:

        async def resolve(request: web.Request) -> web.Response:
            seen["hub"].append(request.headers.get("Authorization", ""))
            raise web.HTTPFound(f"{cdn_server.url}/blob?signature=x")

        def hub_app() -> web.Application:
            application = web.Application()
            application.router.add_get("/{tail:.*}", resolve)
            return application

        with ServerThread(hub_app) as hub:
            async with aiohttp.ClientSession() as session:
                source = HfSource(HttpSource(session), endpoint=hub.url, token="hf_x", timeout_s=5)
                entry = FileEntry("w.bin", len(data), f"{hub.url}/org/m/resolve/{'a' * 40}/w.bin")
                got = b"".join([b async for b in source.open_range(entry, 100, 600)])
    assert got == data[100:600]
    assert seen == {"hub": ["Bearer hf_x"], "cdn": [""]}
