"""Fixtures every test folder may use (registered by ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client session, closed after the test."""
    async with aiohttp.ClientSession() as client:
        yield client
