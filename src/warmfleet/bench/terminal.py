"""The terminal side of the live bench commands (``warmfleet bench``, ``warmfleet demo``,
``make bench-peers``): a console, a progress bar, and the uvloop runner they measure on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from warmfleet.bench.loadgen import RequestResult

T = TypeVar("T")


def console() -> Console:
    out = Console()
    return out if out.is_terminal else Console(width=200)


@contextmanager
def progress_bar(total: int, label: str) -> Iterator[Callable[[RequestResult], None]]:
    """A rich progress bar (hidden when not on a terminal); yields the per-request callback."""
    out = console()
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("errors {task.fields[errors]}"),
    )  # fmt: skip
    with Progress(*columns, console=out, disable=not out.is_terminal, transient=True) as bar:
        task = bar.add_task(label, total=total, errors=0)
        errors = 0

        def done(result: RequestResult) -> None:
            nonlocal errors
            errors += 0 if result.ok else 1
            bar.update(task, advance=1, errors=errors)

        yield done


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when available (the client's CPU cost is part of every measurement)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
