"""Builds and owns the source clients (one aiohttp session, one boto3 client)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import aiohttp

from warmfleet.agent.oci import OciSource
from warmfleet.agent.sources.base import Source
from warmfleet.agent.sources.http import HttpSource, make_session
from warmfleet.agent.sources.local import LocalSource
from warmfleet.cache.config import DownloadSpec, SourcesSpec
from warmfleet.cache.manifest import SourceKind


class SourceSet:
    """``async with SourceSet(...) as sources: sources.get(kind)``."""

    def __init__(self, sources: SourcesSpec, download: DownloadSpec) -> None:
        self._spec = sources
        self._download = download
        self._session: aiohttp.ClientSession | None = None
        self._s3_client: Any = None
        self._built: dict[SourceKind, Source] = {}

    async def __aenter__(self) -> SourceSet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for source in self._built.values():
            await source.aclose()
        self._built.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = make_session(
                self._download.concurrency, self._download.request_timeout_s
            )
        return self._session

    def get(self, kind: SourceKind) -> Source:
        if kind not in self._built:
            self._built[kind] = self._build(kind)
        return self._built[kind]

    def _build(self, kind: SourceKind) -> Source:
        timeout_s = self._download.request_timeout_s
        if kind == SourceKind.LOCAL:
            return LocalSource(symlink_roots=self._spec.local_symlink_roots)
        if kind == SourceKind.HTTP:
            return HttpSource(self._http_session())
        if kind == SourceKind.HF:
            # imported on first use: huggingface_hub and boto3 cost ~0.5 s of start-up each
            from warmfleet.agent.sources.hf import HfSource, read_token  # noqa: PLC0415

            token = read_token(self._spec.hf_token_env, self._spec.hf_token_file)
            return HfSource(
                HttpSource(self._http_session()),
                endpoint=self._spec.hf_endpoint,
                token=token,
                timeout_s=timeout_s,
            )
        if kind == SourceKind.S3:
            from warmfleet.agent.sources.s3 import S3Source, make_s3_client  # noqa: PLC0415

            client = make_s3_client(
                self._spec.s3_endpoint_url,
                self._spec.s3_region,
                self._download.concurrency,
                timeout_s,
            )
            return S3Source(client, self._download.concurrency)
        return OciSource(
            self._http_session(),
            insecure_hosts=self._spec.registry_insecure_hosts,
            max_manifest_bytes=self._spec.registry_max_manifest_bytes,
            timeout_s=timeout_s,
        )
