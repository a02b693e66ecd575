from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.origin import Origin, ServerThread


@pytest.fixture
def origin() -> Iterator[tuple[Origin, str]]:
    org = Origin()
    with ServerThread(org.app) as server:
        yield org, server.url
