"""Benchmark harnesses' JSON results: figures merged into a file other steps also write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

# The harness commands' shared options (each command keeps its own defaults)
OutOpt = Annotated[Path, typer.Option(help="JSON file the figures are merged into")]
SizeOpt = Annotated[int, typer.Option(help="model bytes")]
ThrottleOpt = Annotated[int, typer.Option(help="origin bytes/s")]
MaxSOpt = Annotated[float, typer.Option(help="bound of the whole run")]
DEFAULT_OUT = Path("bench-results/fleet.json")


def merge_into(path: Path, figures: dict[str, Any]) -> None:
    """``figures``' top-level keys set in the JSON object at ``path`` (a missing, unreadable or
    non-object file starts empty); the rest of the file kept."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    doc.update(figures)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
