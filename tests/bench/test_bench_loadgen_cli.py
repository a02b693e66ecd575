"""``warmfleet bench`` against a fake engine on its own thread: the JSON and the report it
writes, what it says about the workload (fewer requests than asked, a synthetic equivalent), a
table that fits 100 columns with ``--format json`` alone on stdout, a rate it cannot run, and its
``--metrics-url`` targets (checked before the load, a warning for one it could not scrape)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench_support import FakeEngine
from typer.testing import CliRunner

from warmfleet.bench.loadgen_metrics import MetricsTarget
from warmfleet.bench.loadgen_preflight import PreflightError, metrics_target
from warmfleet.cli import app
from warmfleet.edge import free_port as closed_port  # nothing listens there


@pytest.fixture
def threaded_engine() -> Iterator[FakeEngine]:
    """A fake engine on its own loop in a thread (for the synchronous CLI)."""
    engine = FakeEngine("t0")
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(engine.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield engine
    asyncio.run_coroutine_threadsafe(engine.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_bench_cli_writes_json(threaded_engine: FakeEngine, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [
        "bench", "--url", threaded_engine.url, "--scenario", "gsp", "--requests", "12",
        "--concurrency", "3", "--max-output-tokens", "4", "--json", str(out),
        "--metrics-url", f"t0={threaded_engine.url}/metrics", "--report", str(tmp_path / "r"),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    run = report["strategies"]["run"]
    assert run["requests"]["completed"] == 12
    assert run["hit_rate_source"] == "engine_metrics"
    assert threaded_engine.requests == 12
    assert (tmp_path / "r" / "report.md").exists()
    assert (report["preset"], report["seed"]) == ("llama-3.1-70b-p5", 0)
    assert report["workload"] == "generated"


def test_bench_cli_says_when_the_scenario_has_fewer_requests_than_asked(
    threaded_engine: FakeEngine,
) -> None:
    args = [
        "bench", "--url", threaded_engine.url, "--scenario", "multi-round-qa", "--requests",
        "60", "--concurrency", "4", "--max-output-tokens", "2",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "workload: multi-round-qa has 50 requests, not 60" in result.output
    assert threaded_engine.requests == 50


def test_bench_cli_says_a_synthetic_equivalent_ran(
    threaded_engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace scenario without its trace file (an empty traces directory) drives its synthetic
    equivalent, and the output and the report say so."""
    monkeypatch.setenv("WARMFLEET_TRACES_DIR", str(tmp_path))
    out = tmp_path / "bench.json"
    args = [
        "bench", "--url", threaded_engine.url, "--scenario", "aws-short-context", "--requests",
        "6", "--concurrency", "2", "--max-output-tokens", "4", "--json", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("workload: synthetic equivalent of ")
    assert json.loads(out.read_text())["workload"].startswith("synthetic equivalent of ")


def test_bench_cli_table_fits_and_json_goes_alone_to_stdout(
    threaded_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piped at COLUMNS=100 the table fits; ``--format json`` prints the report alone on stdout
    (the notes under the table go to stderr)."""
    monkeypatch.setenv("COLUMNS", "100")
    args = [
        "bench", "--url", threaded_engine.url, "--scenario", "gsp", "--requests", "6",
        "--concurrency", "2", "--max-output-tokens", "4", "--label", "least_outstanding_requests",
    ]  # fmt: skip
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    assert max(len(line) for line in table.output.splitlines()) <= 100
    assert "least_outstanding_requests" in table.output
    assert "Not streamed: TTFT is each request's end-to-end latency" in table.output
    shown = CliRunner().invoke(app, [*args, "--format", "json"])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["strategies"]["least_outstanding_requests"]["requests"]["completed"] == 6
    assert "Not streamed" in shown.stderr


@pytest.mark.parametrize(
    "flags", [["--rate", "0"], ["--rate", "2", "--concurrency", "2"]], ids=["zero", "both"]
)
def test_bench_cli_rejects_a_rate_it_cannot_run(flags: list[str]) -> None:
    """A clean usage error (exit 2, the option named), never a traceback from validation."""
    args = ["bench", "--url", "http://127.0.0.1:9", "--scenario", "gsp", *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--rate" in result.output


def test_bench_warns_when_a_metrics_target_cannot_be_scraped(threaded_engine: FakeEngine) -> None:
    """A named ``--metrics-url`` that does not answer is one warning line on stderr (its counts
    are left out), not silently skipped; the one that answers still counts."""
    gone = f"gone=http://127.0.0.1:{closed_port()}/metrics"
    args = [
        "bench", "--url", threaded_engine.url, "--scenario", "gsp", "--requests", "4",
        "--concurrency", "2", "--max-output-tokens", "4", "--format", "json",
        "--metrics-url", f"t0={threaded_engine.url}/metrics", "--metrics-url", gone,
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, result.stderr
    assert "no metrics from --metrics-url gone " in warnings[0]
    run = json.loads(result.stdout)["strategies"]["run"]
    assert run["hit_rate_source"] == "engine_metrics_partial"


@pytest.mark.parametrize(
    "text", ["garbage", "t0=garbage", "t0=ftp://h/metrics", "=http://h/metrics", "t0=http://h:0/"]
)
def test_a_metrics_url_that_is_not_http_is_refused_before_any_load(text: str) -> None:
    with pytest.raises(PreflightError, match="--metrics-url"):
        metrics_target(text)
    args = ["bench", "--url", f"http://127.0.0.1:{closed_port()}", "--scenario", "gsp"]
    result = CliRunner().invoke(app, [*args, "--metrics-url", text])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"warmfleet bench: --metrics-url {text}: "), result.output


def test_a_metrics_url_names_its_target() -> None:
    assert metrics_target("e0=http://h:8000/metrics") == MetricsTarget(
        "e0", "http://h:8000/metrics"
    )
    bare = "http://h:8000/metrics?x=1"
    assert metrics_target(bare) == MetricsTarget(bare, bare)
