"""No function in ``src/warmfleet`` outgrows a reader: about 50 lines, as the guide says (the
module budget is tests/test_layout.py's).

A function's length runs from its first decorator (else its ``def``) to its last line, so a
typer command's option list counts. The functions already over the limit are listed with their
length when the rule came in: one of them may shrink but not grow, and it leaves the list once it
is within the limit (or gone), so the list only gets shorter. A new function over the limit is
split, not listed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import warmfleet

PACKAGE = Path(warmfleet.__file__).parent
MAX_FUNCTION_LINES = 50

# "module path::qualified name": its length in lines when listed (never raise one).
OVER_THE_LIMIT = {
    "gateway/proxy.py::Proxy._route": 61,
    "sim/simulator.py::Simulator.__init__": 57,
    "gateway/http/wire.py::ServerConnection._serve": 55,
}


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function and method under ``tree`` (nested ones too), by qualified name, with its
    length in lines."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            yield f"{prefix}{node.name}", node.end_lineno - first + 1
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def function_lengths(package: Path = PACKAGE) -> dict[str, int]:
    """Every function of the package's modules, as ``module path::qualified name``: its length."""
    found = sorted(package.rglob("*.py"))
    assert len(found) > 100, f"expected the whole package under {package}"
    return {
        f"{path.relative_to(package).as_posix()}::{name}": n
        for path in found
        for name, n in _functions(ast.parse(path.read_text(encoding="utf-8")))
    }


def over_the_limit(lengths: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """The functions over the limit and not listed, or longer than listed; and the listed
    functions now within the limit or gone (their entries to remove)."""
    too_long = {
        name: n
        for name, n in lengths.items()
        if n > max(MAX_FUNCTION_LINES, OVER_THE_LIMIT.get(name, 0))
    }
    stale = [name for name in OVER_THE_LIMIT if lengths.get(name, 0) <= MAX_FUNCTION_LINES]
    return too_long, stale


def test_no_function_over_the_line_budget() -> None:
    too_long, _ = over_the_limit(function_lengths())
    assert too_long == {}, (
        f"functions over {MAX_FUNCTION_LINES} lines (or longer than OVER_THE_LIMIT lists): "
        f"{too_long}; split them into helpers"
    )


def test_the_list_of_long_functions_only_shrinks() -> None:
    _, stale = over_the_limit(function_lengths())
    assert stale == [], (
        f"now within {MAX_FUNCTION_LINES} lines, or gone: remove them from OVER_THE_LIMIT: {stale}"
    )


def test_the_budget_catches_a_long_function(tmp_path: Path) -> None:
    """A function of 60 lines is over the limit; one of 50 is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    for i in range(101):  # function_lengths expects a whole package
        (package / f"m{i}.py").write_text('"""A module."""\n', encoding="utf-8")
    body = "".join(f"    x{i} = {i}\n" for i in range(58))
    (package / "long.py").write_text(f"def long() -> None:\n{body}    del x0\n", encoding="utf-8")
    body = "".join(f"    y{i} = {i}\n" for i in range(48))
    (package / "fits.py").write_text(f"def fits() -> None:\n{body}    del y0\n", encoding="utf-8")
    too_long, _ = over_the_limit(function_lengths(package))
    assert too_long == {"long.py::long": 60}
