"""Issue 21, "progress and logs on long work": ``bench``, ``sim`` and ``demo`` show a live progress
display on a terminal while they run (driven here under a pseudo-terminal, read as it comes),
and plain, bounded log lines without escape codes when their output is piped (on stdout, before
the result: stderr keeps only failures)."""

from __future__ import annotations

import json
import re

import pytest
from cli_support import emulator
from pty_support import ANSI_ESCAPE, run_in_pty, run_piped

pytestmark = pytest.mark.e2e

BAR = "\u2501"  # the heavy horizontal line rich draws its bars with
SIM_ARGS = ("sim", "--scenario", "aws-long-context", "--requests", "1500")
SIM_STRATEGIES = ("--strategies", "random,prefix_affinity")


def _progress_before_end(text_while_running: str, total: int) -> None:
    counts = re.findall(rf"\b(\d+)/{total}\b", ANSI_ESCAPE.sub("", text_while_running))
    assert BAR in text_while_running, text_while_running[-2000:]
    assert any(int(n) > 0 for n in counts), text_while_running[-2000:]


@pytest.mark.slow
def test_sim_shows_progress_on_a_terminal_before_it_ends() -> None:
    out = run_in_pty(*SIM_ARGS, *SIM_STRATEGIES)
    assert out.returncode == 0, out.text[-3000:]
    _progress_before_end(out.text_while_running(), 1500)
    plain = ANSI_ESCAPE.sub("", out.text)
    assert plain.index("random") < plain.index("prefix_affinity")
    assert plain.rindex("1500/1500") < plain.index("working set =")  # then the result table


@pytest.mark.slow
def test_bench_shows_progress_on_a_terminal_before_it_ends() -> None:
    with emulator() as url:
        out = run_in_pty("bench", "--url", url, "--scenario", "gsp", "--requests", "30",
                         "--concurrency", "2")  # fmt: skip
    assert out.returncode == 0, out.text[-3000:]
    _progress_before_end(out.text_while_running(), 30)
    assert "requests of gsp to" in ANSI_ESCAPE.sub("", out.text_while_running())


@pytest.mark.slow
def test_demo_shows_progress_on_a_terminal_before_it_ends(tmp_path: object) -> None:
    out = run_in_pty("demo", "--report", f"{tmp_path}/report", "--requests", "16",
                     "--concurrency", "4", "--speedup", "20", deadline_s=240.0)  # fmt: skip
    assert out.returncode == 0, out.text[-3000:]
    _progress_before_end(out.text_while_running(), 16)
    running = ANSI_ESCAPE.sub("", out.text_while_running())
    assert "random: starting 4 emulated instances and a gateway" in running
    assert "prefix_affinity" in running


@pytest.mark.slow
def test_piped_progress_is_plain_bounded_lines() -> None:
    done = run_piped(*SIM_ARGS, *SIM_STRATEGIES)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "\x1b" not in done.stdout
    table = done.stdout.index("aws-long-context |")
    lines = [line for line in done.stdout[:table].splitlines() if line.strip()]
    assert BAR not in done.stdout[:table]
    # per strategy: a start line, at most one per 10 % and one end line (not one per request)
    assert 6 <= len(lines) <= 3 * 12, done.stdout
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d [^ ].+", line) for line in lines), lines
    assert "hashing the workload's blocks: started (1500 requests)" in lines[0]
    assert any("random: started (1500 requests)" in line for line in lines), lines
    assert "prefix_affinity: done, 1500 requests in" in lines[-1]
    assert "TTFT p50 ms" in done.stdout[table:]  # then the result


def test_progress_leaves_json_output_alone() -> None:
    """With ``--format json`` stdout is the report for a program: the progress goes to stderr."""
    args = ["--requests", "40", "--instances", "2", "--preset", "tiny-cpu", "--format", "json"]
    done = run_piped("sim", "--scenario", "gsp", "--strategies", "random", *args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 40
    assert "random: done, 40 requests in " in done.stderr
