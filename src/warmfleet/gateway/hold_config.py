"""``spec.hold``: the zero-ready hold's settings (``gateway.hold``; kept apart from it so the
configuration model imports no runtime)."""

from __future__ import annotations

from pydantic import Field

from warmfleet.core.config import StrictModel


class HoldConfig(StrictModel):
    """``spec.hold``: hold requests for a variant with no ready instance (scale from zero)."""

    max_held_per_variant: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    retry_after_s: int = Field(default=5, ge=0, description="the Retry-After of a shed request")
