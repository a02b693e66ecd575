"""Hugging Face Hub source: ``huggingface_hub.HfApi`` resolves the revision to a commit and
lists files with sizes, LFS sha256 and git blob ids; bytes come over ranged HTTP from
``{endpoint}/{repo}/resolve/{commit}/{file}`` with the Hub's auth headers."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils._headers import build_hf_headers

from warmfleet.agent.sources.base import SourceError, TransientSourceError
from warmfleet.agent.sources.http import RETRYABLE_STATUS, HttpSource
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import NotFoundError

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# The hub client's network errors (refused, reset, timed out): requests' are OSErrors, httpx's
# (huggingface_hub >= 1) are not, but HfHubHTTPError derives from that library's base error.
_NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, *HfHubHTTPError.__bases__)
DEFAULT_ENDPOINT = "https://huggingface.co"


def read_token(env_var: str, token_file: str | None) -> str | None:
    """Token from the environment variable, else from the file (first line), else None."""
    token = os.environ.get(env_var, "").strip()
    if token:
        return token
    if token_file:
        try:
            return Path(token_file).read_text().strip() or None
        except OSError as err:
            raise SourceError(f"cannot read Hugging Face token file {token_file}: {err}") from err
    return None


class HfSource:
    kind = SourceKind.HF

    def __init__(
        self, http: HttpSource, *, endpoint: str | None, token: str | None, timeout_s: float
    ) -> None:
        self._http = http
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._headers = build_hf_headers(token=token or False, library_name="warmfleet")

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:
        rev = revision or parsed.revision or "main"
        api = HfApi(endpoint=self.endpoint, token=self._token or False)
        try:
            info = await asyncio.to_thread(
                api.model_info,
                parsed.location,
                revision=rev,
                files_metadata=True,
                timeout=self._timeout_s,
            )
        except (RepositoryNotFoundError, RevisionNotFoundError) as err:
            raise NotFoundError(f"hf://{parsed.location}@{rev}: {err}") from err
        except HfHubHTTPError as err:
            status = getattr(err.response, "status_code", None)
            error = TransientSourceError if status in RETRYABLE_STATUS else SourceError
            raise error(f"hf://{parsed.location}@{rev}: {err}") from err
        except _NETWORK_ERRORS as err:
            raise TransientSourceError(f"hf://{parsed.location}@{rev}: {err!r}") from err
        commit = info.sha
        if not commit or not _COMMIT_RE.match(commit):
            raise SourceError(f"hf://{parsed.location}@{rev}: hub returned no commit sha")
        if _COMMIT_RE.match(rev) and rev != commit:
            raise SourceError(f"hf://{parsed.location}: asked for commit {rev}, got {commit}")
        files = []
        for sib in info.siblings or []:
            if sib.size is None:
                raise SourceError(f"hf://{parsed.location}: no size for {sib.rfilename}")
            url = hf_hub_url(
                parsed.location, sib.rfilename, revision=commit, endpoint=self.endpoint
            )
            files.append(
                FileEntry(
                    path=sib.rfilename,
                    size_bytes=sib.lfs.size if sib.lfs else sib.size,
                    locator=url,
                    sha256=sib.lfs.sha256 if sib.lfs else None,
                    git_sha1=None if sib.lfs else sib.blob_id,
                )
            )
        if not files:
            raise SourceError(f"hf://{parsed.location}@{commit}: repository has no files")
        extra = {"requested_revision": rev, "endpoint": self.endpoint}
        return Manifest(SourceKind.HF, parsed.uri, tuple(files), revision=commit, extra=extra)

    def supports_ranges(self, manifest: Manifest) -> bool:  # noqa: ARG002
        return True

    def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        return self._http.open_range_with(entry, start, end, self._headers)

    async def aclose(self) -> None:
        return None
