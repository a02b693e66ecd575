"""Parse artifact URIs into a source kind and its parts (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from warmfleet.cache.manifest import SourceKind
from warmfleet.core.errors import BadRequestError

_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True, slots=True)
class ParsedUri:
    kind: SourceKind
    uri: str  # normalised
    location: str  # path / URL / bucket / repo id / image reference
    key: str = ""  # S3 key or prefix
    revision: str | None = None  # hf://org/model@rev

    def default_name(self) -> str:
        tail = (self.key or self.location).rstrip("/").split("/")[-1]
        if self.kind == SourceKind.HF:
            return self.location
        if self.kind == SourceKind.OCI:
            return self.location.split("/", 1)[-1]
        return tail or self.location


def parse_uri(uri: str) -> ParsedUri:
    """``/abs/path``, ``file:///abs``, ``http(s)://...``, ``s3://bucket/key-or-prefix``,
    ``hf://org/model[@revision]``, ``oci://registry/repo:tag`` (or ``@sha256:...``)."""
    if uri.startswith("/"):
        return ParsedUri(SourceKind.LOCAL, f"file://{uri}", uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if not parts.path.startswith("/") or parts.netloc not in ("", "localhost"):
            raise BadRequestError(f"file URI must be absolute: {uri}", param="uri")
        return ParsedUri(SourceKind.LOCAL, f"file://{parts.path}", parts.path)
    if scheme in ("http", "https"):
        if not parts.netloc:
            raise BadRequestError(f"HTTP URI has no host: {uri}", param="uri")
        return ParsedUri(SourceKind.HTTP, uri, uri)
    if scheme == "s3":
        if not parts.netloc:
            raise BadRequestError(f"S3 URI has no bucket: {uri}", param="uri")
        return ParsedUri(SourceKind.S3, uri, parts.netloc, key=parts.path.lstrip("/"))
    if scheme == "hf":
        repo = (parts.netloc + parts.path).strip("/")
        revision = None
        if "@" in repo:
            repo, revision = repo.split("@", 1)
        if not _HF_REPO_RE.match(repo):
            raise BadRequestError(f"not a Hugging Face repo id: {repo!r}", param="uri")
        return ParsedUri(SourceKind.HF, f"hf://{repo}", repo, revision=revision or None)
    if scheme in ("oci", "docker"):
        ref = (parts.netloc + parts.path).strip("/")
        if not ref or "/" not in ref:
            raise BadRequestError(f"image reference needs registry/repository: {uri}", param="uri")
        return ParsedUri(SourceKind.OCI, f"oci://{ref}", ref)
    raise BadRequestError(
        f"unsupported URI {uri!r}: use a path, http(s)://, s3://, hf:// or oci://", param="uri"
    )
