"""The progress display of the long commands: the pure pieces (when a plain line is due, what it
says), the piped form of ``bench.progress.Activity`` and the simulator's progress reports."""

from __future__ import annotations

import io
import re

from rich.console import Console

from warmfleet.bench.progress import Activity, PhasedProgress
from warmfleet.core.progress import (
    ProgressThrottle,
    finished_line,
    format_bytes,
    format_seconds,
    progress_line,
)
from warmfleet.sim.replica_sweep import run_replica_sweep
from warmfleet.sim.runner import run_comparison
from warmfleet.sim.scenario import builtin_scenario


def test_throttle_bounds_the_lines_of_a_long_task() -> None:
    throttle = ProgressThrottle(0.0)
    total, duration_s = 100_000, 120.0
    due = [i for i in range(total) if throttle.due(i + 1, total, duration_s * i / total)]
    # each 10 % (at most), plus one per 15 s of silence at most
    assert 5 <= len(due) <= 10 + duration_s / 15
    assert not ProgressThrottle(0.0).due(99, 100, 1.0)  # a step, but too soon after the start


def test_throttle_speaks_after_a_long_silence_without_a_total() -> None:
    throttle = ProgressThrottle(0.0)
    assert not throttle.due(5, None, 14.0)
    assert throttle.due(6, None, 15.0)
    assert not throttle.due(7, None, 16.0)


def test_lines_say_amount_rate_elapsed_and_eta() -> None:
    line = progress_line("cache m filling on n1", 30_000_000, 100_000_000, 3.0, "bytes")
    assert line == (
        "cache m filling on n1: 30.0 MB / 100.0 MB (30 %), 10.0 MB/s, 3.0 s elapsed, ETA 7.0 s"
    )
    assert progress_line("random", 50, 200, 10.0) == (
        "random: 50/200 requests (25 %), 10.0 s elapsed, ETA 30.0 s"
    )
    assert finished_line("random", 200, 200, 125.0) == "random: done, 200 requests in 2 min 05 s"
    assert finished_line("f", 2_000, 2_000, 2.0, "bytes") == "f: done, 2.0 kB in 2.0 s (1.0 kB/s)"
    assert format_bytes(999) == "999 B"
    assert format_seconds(3725) == "1 h 02 min"


def test_piped_activity_prints_plain_lines() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, no_color=True)
    with Activity(console=console) as activity:
        assert not activity.live
        assert activity.bar is None
        task = activity.track("work", 10_000)
        for _ in range(10_000):
            task.advance()
        task.finish()
        activity.log("an event")
    lines = [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in buffer.getvalue().splitlines()]
    assert "\x1b" not in buffer.getvalue()
    assert len(lines) == 3, lines  # no line per request: the task took well under 2 s
    assert lines[0] == "work: started (10000 requests)"
    assert lines[1].startswith("work: done, 10000 requests in ")
    assert lines[2] == "an event"


def test_the_simulator_reports_a_phase_per_strategy_and_each_finished_request() -> None:
    seen: list[tuple[str, int]] = []

    class Recorder:
        def phase(self, name: str, total: int) -> None:
            seen.append((name, total))

        def advance(self, done: int = 1) -> None:
            name, count = seen[-1]
            seen[-1] = (name, count - done)

    scenario = builtin_scenario("gsp", 2, "tiny-cpu", 0).model_copy(update={"requests": 40})
    comparison = run_comparison(scenario, ["random", "prefix_hash"], progress=Recorder())
    assert [name for name, _ in seen] == ["hashing the workload's blocks", "random", "prefix_hash"]
    assert all(left == 0 for _, left in seen)  # one advance per request, every one
    assert len(comparison.runs) == 2


def test_phased_progress_finishes_each_phase() -> None:
    buffer = io.StringIO()
    with Activity(console=Console(file=buffer, width=200)) as activity:
        progress = PhasedProgress(activity)
        progress.phase("a", 2)
        progress.advance()
        progress.advance()
        progress.phase("b", 1)
        progress.advance()
        progress.close()
    text = buffer.getvalue()
    assert "a: done, 2 requests in" in text
    assert "b: done, 1 requests in" in text


def test_the_replica_sweep_names_each_cell() -> None:
    phases: list[str] = []

    class Recorder:
        def phase(self, name: str, total: int) -> None:
            phases.append(name)

        def advance(self, done: int = 1) -> None:
            return None

    scenario = builtin_scenario("gsp", 2, "tiny-cpu", 0).model_copy(update={"requests": 20})
    run_replica_sweep(scenario, ["random"], [1, 2], [10.0, None], progress=Recorder())
    assert phases == [
        "hashing the workload's blocks", "random x1", "random x2 sync 10 ms", "random x2 no sync",
    ]  # fmt: skip
