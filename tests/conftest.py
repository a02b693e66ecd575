"""The suite's root conftest: registers the fixtures shared by every test folder, which live in
``tests/support/fixtures.py`` (type-checked there: mypy skips this file, whose module name,
``conftest``, ``tests/agent/conftest.py`` also has)."""

pytest_plugins = ["support.fixtures"]
