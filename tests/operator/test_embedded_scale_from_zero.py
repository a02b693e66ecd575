"""Scale from zero on the embedded backend: an idle variant goes to zero (its last replica kept
asleep as a warm standby, or stopped), held requests bring it back, and they are served."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.scale_from_zero import run_case


@pytest.mark.slow
async def test_standby_is_woken_and_held_requests_are_served(tmp_path: Path) -> None:
    out = await run_case(tmp_path, "standby", 4_000_000, 20_000_000, requests=2)
    assert out["failed_requests"] == 0
    assert out["standby_woken"]  # the sleeping replica served, no new one was started
    assert out["first_token_s"] is not None
    (replica,) = out["replicas_after"]
    assert replica["prepared"]


@pytest.mark.slow
async def test_cold_variant_comes_back_from_zero(tmp_path: Path) -> None:
    out = await run_case(tmp_path, "cold_node", 4_000_000, 20_000_000, requests=2)
    assert out["failed_requests"] == 0
    assert not out["standby_woken"]
    (replica,) = out["replicas_after"]
    assert replica["loadSource"] == "origin"
