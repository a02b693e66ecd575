"""Typed node-agent configuration (``node.yaml``): a versioned document.

```yaml
apiVersion: warmfleet.dev/v1alpha1
kind: NodeCacheConfig
spec:
  root: /var/lib/warmfleet/cache
  capacity: {budget: 200GiB, reserve: 10GiB, high_watermark_frac: 0.9, low_watermark_frac: 0.8}
  download: {concurrency: 8, chunk: 8MiB, bandwidth_limit: 500MB}
  artifacts:
    - {type: model, name: llama, uri: "hf://org/model", revision: <40-hex commit>, pin: true}
    - {type: image, name: vllm, ref: "registry.local:5000/vllm:v1"}
```
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from warmfleet.cache.capacity import CapacityPolicy
from warmfleet.core.config import StrictModel, load_yaml_text, parse_document
from warmfleet.core.kubeapi import KubeApiSpec

API_VERSION: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> int:
    """``1048576``, ``"512MiB"``, ``"5GB"`` -> bytes."""
    if isinstance(value, bool):
        raise ValueError("size must be a number of bytes or a string like '5GiB'")
    if isinstance(value, int | float):
        return int(value)
    match = _SIZE_RE.match(str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use e.g. 1048576, '512MiB', '5GB')")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]


class CapacitySpec(StrictModel):
    budget: Size
    reserve: Size = 0
    high_watermark_frac: float = Field(default=0.9, gt=0, le=1)
    low_watermark_frac: float = Field(default=0.8, gt=0, le=1)

    def policy(self) -> CapacityPolicy:
        return CapacityPolicy(
            budget_bytes=self.budget,
            reserve_bytes=self.reserve,
            high_watermark_frac=self.high_watermark_frac,
            low_watermark_frac=self.low_watermark_frac,
        )


class DownloadSpec(StrictModel):
    concurrency: int = Field(default=8, ge=1, le=256)
    chunk: Size = Field(default=8 * 2**20, gt=0)
    bandwidth_limit: Size | None = None  # bytes per second for this node, None = unlimited
    max_attempts: int = Field(default=5, ge=1)
    verify_attempts: int = Field(default=2, ge=1)
    backoff_base_s: float = Field(default=0.2, gt=0)
    backoff_cap_s: float = Field(default=10.0, gt=0)
    request_timeout_s: float = Field(default=60.0, gt=0)
    preallocate: bool = True
    fsync_every_s: float = Field(default=1.0, ge=0)
    # How long a prefetch waits for another process's download of the same artifact (its
    # per-key lock) before it fails with DownloadLockTimeoutError: bounds a hung holder.
    lock_wait_timeout_s: float = Field(default=3600.0, gt=0)
    # A response body slower than this over low_speed_time_s seconds of waiting for the origin
    # fails (TooSlowError, retried up to max_attempts): a trickling origin cannot hold a fill
    # forever (curl's --speed-limit / --speed-time). 0 turns the guard off.
    min_download_rate_bytes_per_s: Size = 16 * 2**10
    low_speed_time_s: float = Field(default=30.0, gt=0)
    # Staged files open at once (the rest are opened again when needed): a manifest with more
    # files than RLIMIT_NOFILE is fine. Descriptors in use are never closed, so the bound is
    # max(max_open_files, concurrency + 2).
    max_open_files: int = Field(default=64, ge=1)


class SourcesSpec(StrictModel):
    # Local sources: symbolic links are followed only when they resolve inside the source tree
    # or inside one of these directories (e.g. an HF cache's blobs/); none by default.
    local_symlink_roots: tuple[str, ...] = ()
    hf_endpoint: str | None = None  # default: $HF_ENDPOINT, else huggingface.co
    hf_token_env: str = "HF_TOKEN"
    hf_token_file: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    registry_insecure_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    # An image manifest or index (and a token endpoint's answer) larger than this is refused
    # while it is read; it is never read whole first.
    registry_max_manifest_bytes: Size = Field(default=4 * 2**20, gt=0)


class StatusSpec(StrictModel):
    """The agent's HTTP API. Mutating routes need ``Authorization: Bearer <token>`` with the
    token from ``$<token_env>`` or else the first line of ``token_file``; with no token they
    are allowed only on a loopback ``host`` (``warmfleet.agent.api_auth``)."""

    host: str = "127.0.0.1"
    port: int = Field(default=9470, ge=0, le=65535)
    token_env: str = Field(default="WARMFLEET_AGENT_TOKEN", min_length=1)
    token_file: str | None = None


class ModelArtifactSpec(StrictModel):
    type: Literal["model"] = "model"
    name: str = Field(min_length=1)
    uri: str = Field(min_length=1)
    revision: str | None = None
    pin: bool = False


class ImageArtifactSpec(StrictModel):
    type: Literal["image"]
    name: str = Field(min_length=1)
    ref: str = Field(min_length=1)
    platform: str = "linux/amd64"
    pin: bool = False


ArtifactSpec = Annotated[ModelArtifactSpec | ImageArtifactSpec, Field(discriminator="type")]


class KubernetesNodeSpec(KubeApiSpec):
    """The fleet's node protocol on Kubernetes: the agent reads the caches assigned to its Node
    (annotation ``warmfleet.dev/assigned-caches``), fills them, links each ready one as
    ``<root>/<cache>/`` (its files plus a ``.warmfleet-ready`` marker, which is what the engine
    pods see at ``<hostPath>/<cache>``) and reports in ``warmfleet.dev/cache-status``.

    ``host_path``: the host directory mounted at ``root`` (an assignment for another hostPath
    cannot be served here and is reported unhealthy). ``node_name`` ``None``: ``$NODE_NAME``
    (the downward API)."""

    host_path: str = Field(min_length=1, pattern=r"^/")
    node_name: str | None = Field(default=None, min_length=1)
    interval_s: float = Field(default=5.0, gt=0)


class NodeCacheSpec(StrictModel):
    root: str
    capacity: CapacitySpec
    download: DownloadSpec = DownloadSpec()
    sources: SourcesSpec = SourcesSpec()
    status: StatusSpec = StatusSpec()
    reconcile_interval_s: float = Field(default=30.0, gt=0)
    artifacts: tuple[ArtifactSpec, ...] = ()
    kubernetes: KubernetesNodeSpec | None = None


class NodeCacheConfig(StrictModel):
    apiVersion: Literal["warmfleet.dev/v1alpha1"] = API_VERSION
    kind: Literal["NodeCacheConfig"] = "NodeCacheConfig"
    spec: NodeCacheSpec


def load_node_config(text: str, source: str = "node.yaml") -> NodeCacheConfig:
    return parse_document(NodeCacheConfig, load_yaml_text(text, source), source)
