"""Fixtures every test folder may use (registered by ``tests/conftest.py``), and the suite's
hypothesis profile: no per-example deadline (hypothesis's default 200 ms is a timing assertion,
which a shared 2-core machine breaks at random; pytest's per-test timeout still bounds a test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from hypothesis import settings

settings.register_profile("warmfleet", deadline=None)
settings.load_profile("warmfleet")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client session, closed after the test."""
    async with aiohttp.ClientSession() as client:
        yield client
