"""The pure minimum-rate guard (curl's --speed-limit / --speed-time for one response body)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmfleet.cache.config import DownloadSpec
from warmfleet.cache.transfer import LowSpeedGuard
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError


def test_trickle_fails_once_a_window_of_waiting_is_too_slow() -> None:
    guard = LowSpeedGuard(min_rate_bps=1000, window_s=30)
    results = [guard.record(1, 2.0) for _ in range(15)]  # 1 byte every 2 s
    assert results == [True] * 14 + [False]  # judged at the end of the 30 s window


def test_fast_windows_reset_and_a_later_stall_fails() -> None:
    guard = LowSpeedGuard(min_rate_bps=1000, window_s=10)
    for _ in range(95):
        assert guard.record(100_000, 1.0)  # 100 kB/s for 95 s
    # enough in this window already: the wait may last to the end of the next one
    assert guard.wait_budget_s() == pytest.approx(15.0)
    assert not guard.record(0, guard.wait_budget_s() * 1.001)


def test_wait_budget_is_the_rest_of_a_short_window() -> None:
    guard = LowSpeedGuard(min_rate_bps=1000, window_s=10)
    assert guard.wait_budget_s() == pytest.approx(10.0)
    assert guard.record(10, 4.0)
    assert guard.wait_budget_s() == pytest.approx(6.0)


@given(
    rate=st.floats(1, 1e6),
    window_s=st.floats(0.1, 100),
    blocks=st.lists(st.tuples(st.integers(0, 10**7), st.floats(0, 50)), max_size=50),
)
def test_never_fails_an_origin_that_keeps_within_the_budget(
    rate: float, window_s: float, blocks: list[tuple[int, float]]
) -> None:
    """Blocks of at least a window's worth, each arriving within the wait budget, never trip
    the guard; a wait of the whole budget with nothing always does."""
    guard = LowSpeedGuard(rate, window_s)
    for n_bytes, waited_s in blocks:
        enough = max(n_bytes, int(rate * window_s) + 1)
        assert guard.record(enough, min(waited_s, guard.wait_budget_s() * 0.99))
    assert not guard.record(0, guard.wait_budget_s() * 1.001)


def test_config_fields_and_errors() -> None:
    spec = DownloadSpec()
    assert (spec.min_download_rate_bytes_per_s, spec.low_speed_time_s) == (16 * 1024, 30.0)
    assert DownloadSpec(min_download_rate_bytes_per_s="1MiB").min_download_rate_bytes_per_s == 2**20
    with pytest.raises(ConfigError, match="lowSpeedTimeS"):
        parse_document(DownloadSpec, {"low_speed_time_s": 0})
    with pytest.raises(ConfigError, match="maxOpenFiles"):
        parse_document(DownloadSpec, {"max_open_files": 0})
    with pytest.raises(ConfigError):
        LowSpeedGuard(0, 1)
