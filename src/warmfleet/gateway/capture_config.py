"""``spec.capture`` of a Gateway document: privacy-safe traffic capture (docs/gateway.md)."""

from __future__ import annotations

from pydantic import Field

from warmfleet.core.config import StrictModel


class CaptureConfig(StrictModel):
    """One trace line (docs/trace-format.md) per answered request, written to ``path`` off the
    request path. ``max_bytes``: a file past this size is rotated (``path`` -> ``path.1`` ...,
    ``keep_files`` old files kept; 0: the file restarts empty). ``sample_fraction``: the share
    of answered requests captured (deterministic: every 1/fraction-th). ``queue_size``: lines
    waiting for the writer; a line that finds the queue full is dropped and counted."""

    path: str = Field(min_length=1)
    max_bytes: int = Field(default=256 << 20, ge=4096)
    keep_files: int = Field(default=3, ge=0, le=1000)
    sample_fraction: float = Field(default=1.0, ge=0, le=1)
    queue_size: int = Field(default=65536, ge=1, le=1 << 22)
