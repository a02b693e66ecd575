"""``warmfleet cache prefetch``'s progress (stdout), the same for every source: the bytes copied
(a local path, hashed as it is copied) or downloaded, with rate and ETA, and the verification.

On a terminal: rich bars. Piped: plain lines, a start and an end line per step and at most one
per 10 % in between (``warmfleet.core.progress.ProgressThrottle``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from warmfleet.agent.manager import CacheManager
from warmfleet.cache.manifest import SourceKind
from warmfleet.cache.state import ArtifactState
from warmfleet.core.progress import (
    ProgressThrottle,
    finished_line,
    format_bytes,
    progress_line,
)

POLL_S = 0.2
_ENDED = frozenset({ArtifactState.READY, ArtifactState.FAILED})


@dataclass
class Step:
    """One row of the display: one artifact's download (a local copy: ``copying``)."""

    key: str
    label: str
    done: int
    total: int
    state: str
    ended: bool = False


def _steps(manager: CacheManager, kind: SourceKind) -> list[Step]:
    out = []
    for st in manager.live():
        local_copy = kind == SourceKind.LOCAL and st.state == ArtifactState.DOWNLOADING
        state = "copying" if local_copy else st.state.value
        out.append(Step(st.key, st.name, st.bytes_done, st.bytes_total, state, st.state in _ENDED))
    return out


class _Bars:
    def __init__(self, console: Console) -> None:
        columns = (
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[state]}"),
        )  # fmt: skip
        self.bar = Progress(*columns, console=console)
        self.ids: dict[str, TaskID] = {}

    def show(self, step: Step) -> None:
        if step.key not in self.ids:
            self.ids[step.key] = self.bar.add_task(step.label, total=step.total, state="")
        self.bar.update(self.ids[step.key], completed=step.done, total=step.total, state=step.state)


class _Lines:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.started: dict[str, tuple[float, ProgressThrottle]] = {}
        self.ended: set[str] = set()

    def say(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def show(self, step: Step) -> None:
        if step.key in self.ended:
            return
        now_s = time.monotonic()
        if step.key not in self.started:
            self.started[step.key] = (now_s, ProgressThrottle(now_s))
            self.say(f"{step.label}: started ({format_bytes(step.total)})")
        started_s, throttle = self.started[step.key]
        if step.ended:
            self.ended.add(step.key)
            text = finished_line(step.label, step.done, step.total, now_s - started_s, "bytes")
            self.say(f"{text}, {step.state}" if step.state else text)
        elif throttle.due(step.done, step.total, now_s):
            text = progress_line(step.label, step.done, step.total, now_s - started_s, "bytes")
            self.say(f"{text}, {step.state}")


async def show_progress(manager: CacheManager, task: asyncio.Task[Any], kind: SourceKind) -> None:
    """Show ``task``'s steps until it ends (a bar per step on a terminal, else plain lines)."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=200, no_color=True)
    view = _Bars(console) if console.is_terminal else _Lines(console)
    bars = view.bar if isinstance(view, _Bars) else None
    if bars is not None:
        bars.start()
    try:
        while True:
            for step in _steps(manager, kind):
                view.show(step)
            if task.done():
                return
            await asyncio.wait([task], timeout=POLL_S)
    finally:
        if bars is not None:
            bars.stop()
