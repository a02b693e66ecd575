"""Progress of long work, transport-free: what a long run reports, when a plain log line about it
is due, and what that line says.

The pure code that runs long (``sim.runner``) reports through ``RunProgress`` (a phase, then
units of work done); the shells show it: a live bar on a terminal, or, when the output is piped,
plain lines at a bounded rate (``ProgressThrottle``: each ``step_frac`` of the total, at most one
line per ``min_interval_s``, and one at least every ``max_silence_s``). Time is always passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

Unit = Literal["requests", "bytes"]


class RunProgress(Protocol):
    """Where a long pure computation reports: ``phase`` starts a named stretch of ``total``
    units, ``advance`` counts units done in the current one."""

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, done: int = 1) -> None: ...


class NoProgress:
    """Reports nowhere (the default of pure runs)."""

    def phase(self, name: str, total: int) -> None:  # noqa: ARG002 (nothing to show)
        return None

    def advance(self, done: int = 1) -> None:  # noqa: ARG002
        return None


@dataclass
class ProgressThrottle:
    """Decides when a plain progress line is due for one task (none between the first line and
    the last one otherwise): at most ``1 / step_frac + (duration / max_silence_s)`` lines."""

    started_s: float
    step_frac: float = 0.1
    min_interval_s: float = 2.0
    max_silence_s: float = 15.0
    _last_s: float = field(init=False)
    _last_step: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._last_s = self.started_s

    def due(self, done: int, total: int | None, now_s: float) -> bool:
        """True when a line about ``done`` of ``total`` should be printed at ``now_s``."""
        quiet_s = now_s - self._last_s
        step = int(done / total / self.step_frac) if total else 0
        if (step > self._last_step and quiet_s >= self.min_interval_s) or (
            quiet_s >= self.max_silence_s
        ):
            self._last_s, self._last_step = now_s, step
            return True
        return False


_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def format_bytes(size_bytes: float) -> str:
    """Decimal units for people, one decimal: ``999 B``, ``30.0 MB``, ``1.2 GB`` (999.96 kB is
    ``1.0 MB``, never ``1000.0 kB``)."""
    value, unit = float(size_bytes), 0
    while abs(value) >= 999.95 and unit < len(_BYTE_UNITS) - 1:
        value, unit = value / 1000, unit + 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {_BYTE_UNITS[unit]}"


def format_seconds(seconds: float) -> str:
    """``4.2 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _amount(done: int, total: int | None, unit: Unit) -> str:
    if unit == "bytes":
        text = format_bytes(done) + ("" if total is None else f" / {format_bytes(total)}")
    else:
        text = f"{done}" + ("" if total is None else f"/{total}")
    percent = f" ({100 * done / total:.0f} %)" if total else ""
    return f"{text} {unit}{percent}" if unit == "requests" else f"{text}{percent}"


def progress_line(
    label: str, done: int, total: int | None, elapsed_s: float, unit: Unit = "requests"
) -> str:
    """One plain line about a task under way: amount, rate for bytes, elapsed and ETA."""
    parts = [f"{label}: {_amount(done, total, unit)}"]
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    if unit == "bytes" and rate > 0:
        parts.append(f"{format_bytes(rate)}/s")
    parts.append(f"{format_seconds(elapsed_s)} elapsed")
    if total and rate > 0 and done < total:
        parts.append(f"ETA {format_seconds((total - done) / rate)}")
    return ", ".join(parts)


def finished_line(
    label: str, done: int, total: int | None, elapsed_s: float, unit: Unit = "requests"
) -> str:
    """The line that ends a task: how much in how long (with the mean rate for bytes)."""
    amount = format_bytes(done) if unit == "bytes" else f"{done} {unit}"
    if total is not None and done != total:
        amount += f" of {format_bytes(total) if unit == 'bytes' else total}"
    rate = f" ({format_bytes(done / elapsed_s)}/s)" if unit == "bytes" and elapsed_s > 0 else ""
    return f"{label}: done, {amount} in {format_seconds(elapsed_s)}{rate}"
