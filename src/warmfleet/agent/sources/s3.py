"""S3 source (boto3, any ``endpoint_url``): HEAD / list for size, ETag, VersionId and
checksums; ranged GETs pinned to the resolved version (``VersionId`` or ``IfMatch``)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import boto3
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

from warmfleet.agent.sources.base import (
    READ_BLOCK_BYTES,
    SourceChangedError,
    SourceError,
    TransientSourceError,
)
from warmfleet.agent.sources.http import RETRYABLE_STATUS
from warmfleet.cache.manifest import FileEntry, Manifest, SourceKind
from warmfleet.cache.uri import ParsedUri
from warmfleet.core.errors import NotFoundError


def make_s3_client(
    endpoint_url: str | None, region: str | None, concurrency: int, timeout_s: float
) -> Any:
    config = Config(
        max_pool_connections=max(concurrency * 2, 10),
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"max_attempts": 2, "mode": "standard"},
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1", config=config
    )


_TRANSIENT_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"}
)


def _error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _client_error(err: ClientError, what: str) -> SourceError:
    """5xx, throttling and request timeouts are retried; 403, 400 and the like are not."""
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    if status in RETRYABLE_STATUS or _error_code(err) in _TRANSIENT_CODES:
        return TransientSourceError(f"{what}: {err}")
    return SourceError(f"{what}: {err}")


def _etag_is_md5(etag: str | None, head: dict[str, Any]) -> bool:
    """Only a single-part ETag of an object that is unencrypted or SSE-S3 is the data's md5
    (SSE-KMS, DSSE-KMS and SSE-C objects have ETags that are not)."""
    if not etag or "-" in etag or len(etag.strip('"')) != 32:
        return False
    encryption = str(head.get("ServerSideEncryption") or "AES256")
    return encryption == "AES256" and not head.get("SSECustomerAlgorithm")


def _entry_from_head(rel: str, key: str, bucket: str, head: dict[str, Any]) -> FileEntry:
    etag = str(head.get("ETag", "")) or None
    md5 = etag.strip('"') if etag and _etag_is_md5(etag, head) else None
    sha256 = None
    if head.get("ChecksumSHA256") and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
        sha256 = base64.b64decode(head["ChecksumSHA256"]).hex()
    version = head.get("VersionId")
    return FileEntry(
        path=rel,
        size_bytes=int(head["ContentLength"]),
        locator=f"{bucket}/{key}",
        sha256=sha256,
        md5=md5,
        etag=etag,
        version_id=version if version and version != "null" else None,
        last_modified=str(head.get("LastModified")) if head.get("LastModified") else None,
    )


class S3Source:
    kind = SourceKind.S3

    def __init__(self, client: Any, concurrency: int = 8) -> None:
        self._client = client
        self._sem = asyncio.Semaphore(concurrency)

    async def _head(self, bucket: str, key: str) -> dict[str, Any] | None:
        async with self._sem:
            try:
                head: dict[str, Any] = await asyncio.to_thread(
                    self._client.head_object, Bucket=bucket, Key=key, ChecksumMode="ENABLED"
                )
                return head
            except ClientError as err:
                if _error_code(err) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise _client_error(err, f"s3://{bucket}/{key}") from err
            except BotoCoreError as err:
                raise TransientSourceError(f"s3://{bucket}/{key}: {err}") from err

    async def _list(self, bucket: str, prefix: str) -> list[str]:
        def run() -> list[str]:
            keys: list[str] = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
            return keys

        try:
            return await asyncio.to_thread(run)
        except ClientError as err:
            raise _client_error(err, f"s3://{bucket}/{prefix}") from err
        except BotoCoreError as err:
            raise TransientSourceError(f"s3://{bucket}/{prefix}: {err}") from err

    async def resolve(self, parsed: ParsedUri, revision: str | None) -> Manifest:  # noqa: ARG002
        bucket, key = parsed.location, parsed.key
        head = await self._head(bucket, key) if key and not key.endswith("/") else None
        if head is not None:
            entries = [_entry_from_head(key.rsplit("/", 1)[-1], key, bucket, head)]
        else:
            prefix = key if not key or key.endswith("/") else key + "/"
            keys = [k for k in await self._list(bucket, prefix) if not k.endswith("/")]
            if not keys:
                raise NotFoundError(f"s3://{bucket}/{key}: no such object or prefix")
            heads = await asyncio.gather(*(self._head(bucket, k) for k in keys))
            entries = [
                _entry_from_head(k[len(prefix) :], k, bucket, h)
                for k, h in zip(keys, heads, strict=True)
                if h is not None
            ]
        return Manifest(SourceKind.S3, parsed.uri, tuple(sorted(entries, key=lambda e: e.path)))

    def supports_ranges(self, manifest: Manifest) -> bool:  # noqa: ARG002
        return True

    async def open_range(self, entry: FileEntry, start: int, end: int) -> AsyncIterator[bytes]:
        bucket, key = entry.locator.split("/", 1)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
        if entry.version_id:
            kwargs["VersionId"] = entry.version_id
        if entry.etag:
            kwargs["IfMatch"] = entry.etag
        try:
            resp = await asyncio.to_thread(self._client.get_object, **kwargs)
        except ClientError as err:
            if _error_code(err) in ("PreconditionFailed", "412"):
                raise SourceChangedError(f"s3://{entry.locator} changed since resolve") from err
            if _error_code(err) in ("NoSuchKey", "404", "NoSuchVersion", "InvalidRange", "416"):
                raise SourceChangedError(f"s3://{entry.locator} is gone or shrank") from err
            raise _client_error(err, f"s3://{entry.locator}") from err
        except BotoCoreError as err:
            raise TransientSourceError(f"s3://{entry.locator}: {err}") from err
        body = resp["Body"]
        received = 0
        try:
            while True:
                block = await asyncio.to_thread(body.read, READ_BLOCK_BYTES * 4)
                if not block:
                    break
                received += len(block)
                yield block
        except BotoCoreError as err:
            raise TransientSourceError(f"s3://{entry.locator}: {err}") from err
        finally:
            body.close()
        if received != end - start:
            raise TransientSourceError(f"s3://{entry.locator}: truncated ({received} bytes)")

    async def aclose(self) -> None:
        return None
