"""No import cycle among the modules of ``warmfleet``.

The graph is grimp's (the one import-linter builds): every ``import`` a module's source holds,
at module level or inside a function, **including those under ``if TYPE_CHECKING:``**. A
type-only import does not fail at run time, but it still ties the two modules together: each
must be read (and changed) with the other, which is what a cycle costs. So the lower module
declares what it uses of the higher one as a ``Protocol`` (as ``gateway/http/messages.py`` does
for the connection a request came on) instead of importing it. Imports inside functions count
too: deferring an import hides a cycle from the interpreter, not from the reader.

A cycle is a strongly connected component of the directed import graph with more than one
module; the test names each cycle's modules and the imports (with line numbers) that close it.
"""

from __future__ import annotations

from collections.abc import Iterator

import grimp

PACKAGE = "warmfleet"


def _components(graph: grimp.ImportGraph) -> Iterator[frozenset[str]]:
    """Strongly connected components (Tarjan's algorithm, iterative: the graph is deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    work: list[tuple[str, Iterator[str]]] = []  # the depth-first path, with what is left to visit

    def enter(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        work.append((module, iter(sorted(graph.find_modules_directly_imported_by(module)))))

    for root in sorted(graph.modules):
        if root in index:
            continue
        enter(root)
        while work:
            module, imported = work[-1]
            for target in imported:
                if target not in index:
                    enter(target)
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component: set[str] = set()
                    while module not in component:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                    yield frozenset(component)


def import_cycles(graph: grimp.ImportGraph) -> set[frozenset[str]]:
    return {c for c in _components(graph) if len(c) > 1}


def describe(graph: grimp.ImportGraph, cycle: frozenset[str]) -> str:
    lines = []
    for importer in sorted(cycle):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & cycle):
            details = graph.get_import_details(importer=importer, imported=imported)
            at = ", ".join(str(d["line_number"]) for d in details)
            lines.append(f"  {importer} -> {imported} (line {at})")
    return "\n".join(lines)


def test_no_import_cycle_among_warmfleet_modules() -> None:
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=False)
    cycles = sorted(import_cycles(graph), key=sorted)
    assert not cycles, "import cycles:\n" + "\n".join(describe(graph, c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle_and_only_the_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b", line_number=1, line_contents="import b")
    graph.add_import(importer="pkg.b", imported="pkg.c", line_number=1, line_contents="import c")
    graph.add_import(importer="pkg.c", imported="pkg.a", line_number=1, line_contents="import a")
    graph.add_import(importer="pkg.c", imported="pkg.d", line_number=2, line_contents="import d")
    assert import_cycles(graph) == {frozenset({"pkg.a", "pkg.b", "pkg.c"})}
    assert "pkg.c -> pkg.a (line 1)" in describe(graph, frozenset({"pkg.a", "pkg.b", "pkg.c"}))
