"""The modules ``setup.py`` compiles with mypyc (docs/compiled.md), read from ``setup.py`` itself
(importing it would run the build), and which of them an editable install left stale."""

from __future__ import annotations

import ast
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def compiled_sources() -> list[Path]:
    """The sources ``setup.py``'s ``COMPILED`` names."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets
        ):
            return [ROOT / path for path in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no COMPILED list")


def module_name(source: Path) -> str:
    return ".".join(source.relative_to(ROOT / "src").with_suffix("").parts)


def built_extension(source: Path) -> Path | None:
    """The extension module built in place beside ``source``, if any."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def stale_extensions() -> list[str]:
    """Compiled modules older than their source (edited since the last ``make``): the import
    system would load the old code."""
    stale = []
    for source in compiled_sources():
        built = built_extension(source)
        if built is not None and built.stat().st_mtime < source.stat().st_mtime:
            stale.append(module_name(source))
    return stale
