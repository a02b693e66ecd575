"""The suite's root conftest: registers the fixtures shared by every test folder, which live in
``tests/support/fixtures.py`` (type-checked there: mypy skips this file, whose module name,
``conftest``, ``tests/agent/conftest.py`` also has), and refuses to run on stale compiled
modules (``tests/support/compiled.py``)."""

import pytest

from support.compiled import stale_extensions

pytest_plugins = ["support.fixtures"]


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = stale_extensions()
    if stale:
        pytest.exit(
            f"compiled modules older than their source: {', '.join(stale)}; rebuild them with "
            "`make unit` (or `.venv/bin/pip install -e '.[dev]'`), docs/compiled.md",
            returncode=4,
        )
