"""The terminal side of the live bench commands (``warmfleet bench``, ``warmfleet demo``,
``make bench-peers``): a console, a progress display (``bench.progress``: a bar on a terminal,
plain lines when piped), and the uvloop runner they measure on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.console import Console

from warmfleet.bench.loadgen import RequestResult
from warmfleet.bench.progress import Activity

T = TypeVar("T")


def console() -> Console:
    out = Console()
    return out if out.is_terminal else Console(width=200)


@contextmanager
def progress_bar(
    total: int, label: str, activity: Activity | None = None
) -> Iterator[Callable[[RequestResult], None]]:
    """Requests done of ``total`` (with the errors so far) on ``activity``'s display, or on one
    of its own; yields the per-request callback."""
    with contextlib.ExitStack() as stack:
        if activity is None:
            activity = stack.enter_context(Activity())
        task = activity.track(label, total)
        errors = 0

        def done(result: RequestResult) -> None:
            nonlocal errors
            errors += 0 if result.ok else 1
            task.update(task.done + 1, note=f"errors {errors}" if errors else "")

        try:
            yield done
        finally:
            task.finish()


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when available (the client's CPU cost is part of every measurement)."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
