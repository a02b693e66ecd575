"""Progress of the long commands (``bench``, ``sim``, ``demo``, ``up``), on stdout before their
result.

On a terminal: a rich live display, one bar per task (its phase name, done / total, elapsed and
ETA; bytes with their rate for fills) with event lines printed above it. Piped: plain lines only,
no escape codes, at a bounded rate per task (``warmfleet.core.progress.ProgressThrottle``) plus
one line when a task starts and one when it ends. stderr stays for failures (a few lines: a
script reading it sees why a command failed, not its progress).
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from warmfleet.core.progress import (
    ProgressThrottle,
    Unit,
    finished_line,
    format_bytes,
    progress_line,
)
from warmfleet.display import OutputFormat


def progress_console(*, stderr: bool = False) -> Console:
    """The console progress goes to: stdout (stderr for a command whose stdout is TSV or JSON),
    plain and wide when it is not a terminal."""
    out = Console(stderr=stderr)
    return out if out.is_terminal else Console(stderr=stderr, width=200, no_color=True)


class _AmountColumn(ProgressColumn):
    """``12/240`` for requests, ``30.0 MB / 100.0 MB 12.0 MB/s`` for bytes, and the note."""

    def render(self, task: Task) -> Text:
        total = None if task.total is None else int(task.total)
        done = int(task.completed)
        if task.fields.get("unit") == "bytes":
            size = format_bytes(done) + ("" if total is None else f" / {format_bytes(total)}")
            speed = task.finished_speed or task.speed
            text = size + (f" {format_bytes(speed)}/s" if speed else "")
        else:
            text = f"{done}" + ("" if total is None else f"/{total}")
        note = task.fields.get("note") or ""
        return Text(f"{text} {note}".rstrip())


class Tracker:
    """One task of an ``Activity``: count what is done, then ``finish`` it (once)."""

    def __init__(self, activity: Activity, label: str, total: int | None, unit: Unit) -> None:
        self._activity = activity
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self.note = ""
        self.started_s = time.monotonic()
        self._throttle = ProgressThrottle(self.started_s)
        self._task: TaskID | None = None
        self.finished = False
        if activity.bar is not None:
            self._task = activity.bar.add_task(label, total=total, unit=unit, note="")
        else:
            what = "" if total is None else f" ({_total_text(total, unit)})"
            activity.log(f"{label}: started{what}")

    def advance(self, done: int = 1) -> None:
        self.update(self.done + done)

    def update(self, done: int, total: int | None = None, note: str | None = None) -> None:
        """``done`` units so far (of ``total``, when it became known), with a short ``note``."""
        if self.finished:
            return
        self.done = done
        self.total = total if total is not None else self.total
        self.note = note if note is not None else self.note
        bar = self._activity.bar
        if bar is not None and self._task is not None:
            bar.update(self._task, completed=done, total=self.total, note=self.note)
            return
        now_s = time.monotonic()
        if self._throttle.due(done, self.total, now_s):
            line = progress_line(self.label, done, self.total, now_s - self.started_s, self.unit)
            self._activity.log(line + (f", {self.note}" if self.note else ""))

    def finish(self, *, keep: bool = True) -> None:
        """The end line (piped), or the bar left complete (terminal); ``keep=False`` replaces
        the bar by the end line (a long-running command's bars do not pile up)."""
        if self.finished:
            return
        self.finished = True
        elapsed_s = time.monotonic() - self.started_s
        bar = self._activity.bar
        if bar is not None and self._task is not None:
            bar.update(self._task, completed=self.done, total=self.total, note=self.note)
            bar.stop_task(self._task)
            if keep:
                return
            bar.remove_task(self._task)
            bar.refresh()  # gone before the end line is printed above the bars
        line = finished_line(self.label, self.done, self.total, elapsed_s, self.unit)
        self._activity.log(line + (f", {self.note}" if self.note else ""))


def _total_text(total: int, unit: Unit) -> str:
    return format_bytes(total) if unit == "bytes" else f"{total} {unit}"


class Activity:
    """The progress display of one command (a context manager): ``track`` tasks, ``log`` events.

    ``live`` forces the terminal form (True) or the plain one (False); by default it follows
    whether stdout is a terminal. Every line starts with the time of day.
    """

    def __init__(self, *, console: Console | None = None, live: bool | None = None) -> None:
        self.console = console or progress_console()
        self.live = self.console.is_terminal if live is None else live
        self.bar: Progress | None = None

    def __enter__(self) -> Activity:
        if self.live:
            columns = (
                TextColumn("{task.description}"), BarColumn(bar_width=30), _AmountColumn(),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            )  # fmt: skip
            self.bar = Progress(*columns, console=self.console, transient=False)
            self.bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def track(self, label: str, total: int | None, unit: Unit = "requests") -> Tracker:
        return Tracker(self, label, total, unit)

    def log(self, message: str) -> None:
        """One event line: above the bars on a terminal, a plain line otherwise."""
        stamp = time.strftime("%H:%M:%S")
        if self.bar is not None:
            self.bar.console.print(f"[dim]{stamp}[/dim] {message}", highlight=False)
        else:
            self.console.print(f"{stamp} {message}", markup=False, highlight=False, soft_wrap=True)


def activity_for(fmt: OutputFormat) -> Activity:
    """The progress display of a command printing ``fmt``: beside the table on stdout, on stderr
    when stdout is TSV or JSON for a program."""
    return Activity(console=progress_console(stderr=fmt != OutputFormat.table))


class PhasedProgress:
    """``warmfleet.core.progress.RunProgress`` over an ``Activity``: one task per phase, the
    previous one finished when the next starts (and by ``close``)."""

    def __init__(self, activity: Activity, unit: Unit = "requests") -> None:
        self._activity = activity
        self._unit = unit
        self._current: Tracker | None = None

    def phase(self, name: str, total: int) -> None:
        self.close()
        self._current = self._activity.track(name, total, self._unit)

    def advance(self, done: int = 1) -> None:
        if self._current is not None:
            self._current.advance(done)

    def close(self) -> None:
        if self._current is not None:
            self._current.finish()
            self._current = None
