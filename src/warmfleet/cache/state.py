"""The artifact state machine and the per-artifact record the index keeps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from warmfleet.cache.manifest import Manifest
from warmfleet.core.errors import CacheError


class ArtifactState(StrEnum):
    PENDING = "pending"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    READY = "ready"
    FAILED = "failed"


_ALLOWED: dict[ArtifactState, frozenset[ArtifactState]] = {
    ArtifactState.PENDING: frozenset({ArtifactState.DOWNLOADING, ArtifactState.FAILED}),
    ArtifactState.DOWNLOADING: frozenset(
        {ArtifactState.VERIFYING, ArtifactState.FAILED, ArtifactState.PENDING}
    ),
    ArtifactState.VERIFYING: frozenset(
        {ArtifactState.READY, ArtifactState.FAILED, ArtifactState.DOWNLOADING}
    ),
    ArtifactState.READY: frozenset({ArtifactState.VERIFYING, ArtifactState.FAILED}),
    ArtifactState.FAILED: frozenset({ArtifactState.PENDING}),
}


class StateTransitionError(CacheError):
    """An illegal state change (e.g. publishing an artifact that was never verified)."""


def check_transition(old: ArtifactState, new: ArtifactState) -> None:
    if new == old:
        return
    if new not in _ALLOWED[old]:
        raise StateTransitionError(f"illegal artifact transition {old.value} -> {new.value}")


@dataclass(frozen=True, slots=True)
class ArtifactRecord:
    """What the index knows about one cache version (one content key)."""

    key: str
    name: str
    uri: str
    size_bytes: int
    state: ArtifactState = ArtifactState.PENDING
    refs: frozenset[str] = frozenset()
    pinned: bool = False
    last_used_s: float = 0.0
    created_s: float = 0.0
    reason: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def evictable(self) -> bool:
        """Only ready, unpinned, unreferenced artifacts may ever be evicted."""
        return self.state == ArtifactState.READY and not self.pinned and not self.refs

    def transition(self, new: ArtifactState, reason: str = "") -> ArtifactRecord:
        check_transition(self.state, new)
        return replace(self, state=new, reason=reason if new == ArtifactState.FAILED else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "uri": self.uri,
            "size_bytes": self.size_bytes,
            "state": self.state.value,
            "refs": sorted(self.refs),
            "pinned": self.pinned,
            "last_used_s": self.last_used_s,
            "created_s": self.created_s,
            "reason": self.reason,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactRecord:
        return cls(
            key=str(data["key"]),
            name=str(data["name"]),
            uri=str(data["uri"]),
            size_bytes=int(data["size_bytes"]),
            state=ArtifactState(data["state"]),
            refs=frozenset(data.get("refs") or ()),
            pinned=bool(data.get("pinned", False)),
            last_used_s=float(data.get("last_used_s", 0.0)),
            created_s=float(data.get("created_s", 0.0)),
            reason=str(data.get("reason", "")),
            extra={str(k): str(v) for k, v in (data.get("extra") or {}).items()},
        )


def record_for(manifest: Manifest, name: str, now_s: float) -> ArtifactRecord:
    """The pending record of a newly admitted artifact."""
    extra = {"kind": manifest.kind.value, **manifest.extra}
    if manifest.revision:
        extra["revision"] = manifest.revision
    return ArtifactRecord(
        manifest.key(),
        name,
        manifest.uri,
        manifest.size_bytes,
        created_s=now_s,
        last_used_s=now_s,
        extra=extra,
    )
