"""OCI registry client (distribution API v2) as a cache source.

Resolves ``oci://registry/repo:tag`` to a manifest digest (following image indexes / Docker
manifest lists to one platform), verifies every manifest's sha256 against the requested digest
and ``Docker-Content-Digest``, and lays the image out as an OCI Image Layout
(``oci-layout``, ``index.json``, ``blobs/sha256/<hex>``) whose files are all digest-verified by
the normal download path. Bearer-token auth (anonymous) is supported.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from warmfleet.agent.bounded_json import loads_bounded, read_bounded
from warmfleet.agent.sources.base import AuthChallengeError, SourceError, TransientSourceError
from warmfleet.agent.sources.http import RETRYABLE_STATUS, HttpSource
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import IntegrityError, NotFoundError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
INLINE = "inline:"
DEFAULT_MAX_MANIFEST_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    @classmethod
    def parse(cls, ref: str) -> ImageRef:
        registry, _, rest = ref.partition("/")
        if not rest:
            raise SourceError(f"image reference needs a registry host: {ref}")
        digest = None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not _DIGEST_RE.match(digest):
                raise SourceError(f"unsupported digest in {ref} (sha256 only)")
        tag = None
        if ":" in rest.rsplit("/", 1)[-1]:
            rest, tag = rest.rsplit(":", 1)
        if not digest and not tag:
            tag = "latest"
        return cls(registry, rest, tag, digest)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _platform_matches(desc: Any, platform: str) -> bool:
    want = platform.split("/")
    got = desc.get("platform") if isinstance(desc, Mapping) else None
    if not isinstance(got, Mapping):
        return False
    have = [got.get("os", ""), got.get("architecture", "")]
    if len(want) > 2:
        have.append(got.get("variant", ""))
    return have == want


def _descriptor(desc: Any, where: str) -> dict[str, Any]:
    """A content descriptor pinned by a sha256 digest and a size (else refused)."""
    if not isinstance(desc, dict) or not _DIGEST_RE.match(str(desc.get("digest", ""))):
        raise SourceError(f"{where}: descriptor without a sha256 digest: {desc!r}")
    size = desc.get("size")
    if not isinstance(size, int) or size < 0:
        raise SourceError(f"{where}: descriptor {desc['digest']} without a valid size")
    return desc


def _platform_descriptor(index: dict[str, Any], platform: str, where: str) -> dict[str, Any]:
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise SourceError(f"{where}: image index without a manifests list")
    descs = [d for d in manifests if _platform_matches(d, platform)]
    if not descs:
        raise NotFoundError(f"{where}: no manifest for {platform}")
    return _descriptor(descs[0], where)


def _blob_descriptors(doc: dict[str, Any], where: str) -> list[dict[str, Any]]:
    layers = doc.get("layers", [])
    if not isinstance(doc.get("config"), dict) or not isinstance(layers, list):
        raise SourceError(f"{where}: image manifest without a config or a layers list")
    return [_descriptor(d, where) for d in [doc["config"], *layers]]


class OciSource:
    kind = SourceKind.OCI

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        insecure_hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        platform: str = "linux/amd64",
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
        timeout_s: float | None = None,
    ) -> None:
        self._max_manifest_bytes = max_manifest_bytes
        self._timeout_s = timeout_s
        self._session = session
        self._http = HttpSource(session)
        self._insecure = insecure_hosts
        self._platform = platform
        self._inline: dict[str, bytes] = {}
        self._tokens: dict[str, str] = {}  # per repository base URL: tokens are scoped
        self._refs: dict[str, ImageRef] = {}

    def _base(self, ref: ImageRef) -> str:
        host = ref.registry.rsplit(":", 1)[0]
        scheme = "http" if host in self._insecure else "https"
        return f"{scheme}://{ref.registry}/v2/{ref.repository}"

    def _auth(self, base: str) -> dict[str, str]:
        token = self._tokens.get(base)
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _get(self, ref: ImageRef, url: str, headers: dict[str, str]) -> tuple[bytes, Any]:
        """A manifest GET (a second one after a 401 and a login); each must be answered in
        full within ``timeout_s``: a trickling registry cannot hold a resolve."""
        for attempt in range(2):
            try:
                async with asyncio.timeout(self._timeout_s):
                    got = await self._get_once(ref, url, headers, renew=attempt == 0)
            except TimeoutError as err:
                raise TransientSourceError(
                    f"GET {url}: no complete answer within {self._timeout_s:g} s "
                    f"(download.request_timeout_s)"
                ) from err
            if got is not None:
                return got
        raise SourceError(f"{url}: registry refused the credentials")

    async def _get_once(
        self, ref: ImageRef, url: str, headers: dict[str, str], *, renew: bool
    ) -> tuple[bytes, Any] | None:
        """The body and headers, or None after a 401 that got a new token (``renew``)."""
        base = self._base(ref)
        try:
            async with self._session.get(url, headers={**headers, **self._auth(base)}) as resp:
                if resp.status == 401 and renew:  # no token yet, or it expired
                    await self._login(base, ref, resp.headers.get("WWW-Authenticate", ""))
                    return None
                if resp.status == 404:
                    raise NotFoundError(f"{url}: not found in registry")
                if resp.status >= 400:
                    err = TransientSourceError if resp.status in RETRYABLE_STATUS else SourceError
                    raise err(f"{url}: HTTP {resp.status}")
                what = f"{url} (sources.registry_max_manifest_bytes)"
                return await read_bounded(resp, self._max_manifest_bytes, what), resp.headers
        except aiohttp.ClientError as err:
            raise TransientSourceError(f"GET {url}: {err}") from err

    async def _login(self, base: str, ref: ImageRef, challenge: str) -> None:
        """Anonymous bearer token for one repository (tokens are scoped to it and expire)."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not challenge.lower().startswith("bearer") or "realm" not in params:
            raise SourceError(f"{ref.registry}: unsupported auth challenge {challenge!r}")
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        query.setdefault("scope", f"repository:{ref.repository}:pull")
        try:
            async with self._session.get(params["realm"], params=query) as resp:
                if resp.status >= 400:
                    err = TransientSourceError if resp.status >= 500 else SourceError
                    raise err(f"{ref.registry}: token endpoint HTTP {resp.status}")
                what = f"{ref.registry}: token endpoint"
                raw = await read_bounded(resp, self._max_manifest_bytes, what)
        except aiohttp.ClientError as err:
            raise TransientSourceError(f"{ref.registry}: token endpoint: {err}") from err
        body = loads_bounded(raw, f"{ref.registry}: token endpoint answer")
        if not isinstance(body, dict):
            raise SourceError(f"{ref.registry}: token endpoint sent no JSON object")
        token = body.get("token") or body.get("access_token")
        if not token:
            raise SourceError(f"{ref.registry}: token endpoint returned no token")
        self._tokens[base] = str(token)
        self._refs[base] = ref

    async def fetch_manifest(
        self, ref: ImageRef, reference: str
    ) -> tuple[bytes, dict[str, Any], str, str]:
        """Manifest bytes, parsed document, media type and verified digest. The body is read
        up to ``max_manifest_bytes`` and its nesting depth checked before it is parsed."""
        body, headers = await self._get(
            ref, f"{self._base(ref)}/manifests/{reference}", {"Accept": ACCEPT}
        )
        digest = sha256_digest(body)
        if reference.startswith("sha256:") and reference != digest:
            raise IntegrityError(f"manifest {reference} hashes to {digest}")
        claimed = headers.get("Docker-Content-Digest")
        if claimed and claimed != digest:
            raise IntegrityError(f"registry claims {claimed} but manifest hashes to {digest}")
        doc = loads_bounded(body, f"manifest {reference} of {ref.repository}")
        if not isinstance(doc, dict):
            raise SourceError(f"manifest {reference} of {ref.repository} is not a JSON object")
        media = doc.get("mediaType") or headers.get("Content-Type", "").split(";")[0]
        return body, doc, str(media), digest

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:
        ref = ImageRef.parse(parsed.location)
        top, top_doc, media, top_digest = await self.fetch_manifest(ref, revision or ref.reference)
        blobs: dict[str, tuple[int, str]] = {top_digest: (len(top), INLINE + top_digest)}
        self._inline[top_digest] = top
        image, image_doc, image_digest = top, top_doc, top_digest
        if media in INDEX_TYPES:
            child = _platform_descriptor(top_doc, self._platform, parsed.location)
            image, image_doc, child_media, image_digest = await self.fetch_manifest(
                ref, child["digest"]
            )
            if child_media in INDEX_TYPES or len(image) != child["size"]:
                raise SourceError(
                    f"{parsed.location}: {child['digest']} is not the image manifest the "
                    f"index describes ({child_media}, {len(image)} of {child['size']} bytes)"
                )
            self._inline[image_digest] = image
            blobs[image_digest] = (len(image), INLINE + image_digest)
        for desc in _blob_descriptors(image_doc, parsed.location):
            blobs[desc["digest"]] = (desc["size"], f"{self._base(ref)}/blobs/{desc['digest']}")
        files = [
            FileEntry(path=f"blobs/sha256/{d[7:]}", size_bytes=size, locator=loc, sha256=d[7:])
            for d, (size, loc) in blobs.items()
        ]
        files += self._layout_files(ref, media, top_digest, len(top))
        extra = {"digest": image_digest, "index_digest": top_digest, "platform": self._platform}
        return Manifest(
            SourceKind.OCI,
            parsed.uri,
            tuple(sorted(files, key=lambda f: f.path)),
            revision=top_digest,
            extra=extra,
        )

    def _layout_files(self, ref: ImageRef, media: str, digest: str, size: int) -> list[FileEntry]:
        desc: dict[str, Any] = {"mediaType": media, "digest": digest, "size": size}
        if ref.tag:
            desc["annotations"] = {"org.opencontainers.image.ref.name": ref.tag}
        docs = {
            "oci-layout": {"imageLayoutVersion": "1.0.0"},
            "index.json": {"schemaVersion": 2, "manifests": [desc]},
        }
        out = []
        for name, doc in docs.items():
            data = json.dumps(doc, sort_keys=True).encode()
            d = sha256_digest(data)
            self._inline[d] = data
            out.append(FileEntry(name, len(data), INLINE + d, sha256=d[7:]))
        return out

    def supports_ranges(self, manifest: Manifest) -> bool:  # noqa: ARG002
        return True

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        if entry.locator.startswith(INLINE):
            data = self._inline.get(entry.locator[len(INLINE) :])
            if data is None:
                raise SourceError(f"{entry.path}: resolve the image again before downloading")
            yield data[start:end]
            return
        base = entry.locator.rsplit("/blobs/", 1)[0]
        for attempt in range(2):
            try:
                async for block in self._http.open_range_with(entry, start, end, self._auth(base)):
                    yield block
                return
            except AuthChallengeError as err:  # before any byte: the token expired
                ref = self._refs.get(base)
                if attempt or ref is None:
                    raise
                await self._login(base, ref, err.challenge)

    async def aclose(self) -> None:
        return None
