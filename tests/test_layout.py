"""The package's shape (issue 25): every module says what it is, no module outgrows a reader
(the tests' modules included), and nothing under ``src/warmfleet`` is a test harness."""

from __future__ import annotations

import ast
from pathlib import Path

import warmfleet

PACKAGE = Path(warmfleet.__file__).parent
MAX_LINES = 400
TESTS = Path(__file__).resolve().parent
# The tests' budget is the same "about 400": one acceptance scenario reads best whole.
MAX_TEST_LINES = 410
# Test doubles, fault injectors and acceptance runs live under tests/ (or benchmarks/), never here.
HARNESS_NAMES = ("testing", "fake", "mock", "faults", "acceptance", "harness")


def _modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 100, f"expected the whole package under {PACKAGE}"
    return found


def test_every_module_has_a_docstring() -> None:
    missing = [
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if len(ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "") < 30
    ]
    assert missing == [], f"modules without a docstring that says what they are: {missing}"


def test_no_module_over_the_line_budget() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_no_test_module_over_the_line_budget() -> None:
    found = sorted(TESTS.rglob("*.py"))
    assert len(found) > 100, f"expected the whole test tree under {TESTS}"
    long = {
        str(p.relative_to(TESTS)): n
        for p in found
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_TEST_LINES
    }
    assert long == {}, f"test modules over {MAX_TEST_LINES} lines: {long}"


def test_no_test_harness_in_the_package() -> None:
    harness = [
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if any(part.removesuffix(".py") in HARNESS_NAMES for part in p.relative_to(PACKAGE).parts)
    ]
    assert harness == [], f"test harnesses shipped in the package: {harness}"
