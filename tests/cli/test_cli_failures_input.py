"""Expected failures caused by what a user hands a command (a URI, a path, a trace, a file's
bytes, a server that is not vLLM, Ctrl-C): one line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_support import WARMFLEET, assert_short_failure, run_cli

pytestmark = pytest.mark.e2e
NOT_UTF8 = b"\xff\xfebad: [1\n"


@pytest.mark.parametrize("uri", ["ftp://x", "hf://", "relative/missing"])
def test_cache_prefetch_of_a_bad_uri_is_one_line(tmp_path: Path, uri: str) -> None:
    done = run_cli("cache", "prefetch", uri, "--dest", str(tmp_path / "cache"), cwd=tmp_path)
    stderr = assert_short_failure(done, 2)
    assert "Task exception was never retrieved" not in stderr
    assert stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("option", "value"),
    [("--chunk", "0"), ("--chunk", "abc"), ("--concurrency", "0"), ("--bandwidth-limit", "-1")],
)
def test_cache_prefetch_download_options_are_usage_errors(
    tmp_path: Path, option: str, value: str
) -> None:
    done = run_cli("cache", "prefetch", "/x", "--dest", str(tmp_path / "c"), option, value)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert option in done.stderr


def test_cache_prefetch_options_win_over_its_config(tmp_path: Path) -> None:
    """They were ignored silently when ``--config`` was given."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("hello\n")
    node = tmp_path / "node.yaml"
    node.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: NodeCacheConfig\n"
        f"spec:\n  root: {tmp_path / 'root'}\n  capacity: {{budget: 1GiB, reserve: 0}}\n"
    )
    base = ["cache", "prefetch", str(tmp_path / "src"), "--config", str(node)]
    stderr = assert_short_failure(run_cli(*base, "--budget", "1B"), 1)
    assert "budget 1," in stderr
    chunk = run_cli(*base, "--chunk", "0")
    assert chunk.returncode == 2
    assert "--chunk" in chunk.stderr
    assert run_cli(*base).returncode == 0


def test_cache_prefetch_takes_a_relative_path(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = run_cli("cache", "prefetch", "model", "--dest", str(tmp_path / "c"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_cache_errors_are_printed_as_they_are(tmp_path: Path) -> None:
    """A message is not read as rich markup (a path with ``[...]`` in it) nor wrapped."""
    for path in ("/nonexistent/[/bold]", "/nonexistent/[red]x"):
        done = run_cli("cache", "prefetch", path, "--dest", str(tmp_path / "c"))
        stderr = assert_short_failure(done, 1)
        assert stderr.startswith("error: ")
        assert path in stderr
        assert stderr.count("\n") == 1


@pytest.mark.parametrize("text", ["{", "[1]", '{"artifacts": [{"key": 1}]}', '{"artifacts": 3}'])
def test_a_cache_index_of_another_shape_is_one_line(tmp_path: Path, text: str) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "index.json").write_text(text)
    stderr = assert_short_failure(run_cli("cache", "ls", "--dest", str(root)), 1)
    assert "index.json" in stderr
    assert stderr.count("\n") == 1


def _empty_traces(tmp_path: Path) -> list[Path]:
    empty, blank = tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"
    empty.write_text("")
    blank.write_text("\n\n")
    return [empty, blank]


def test_an_empty_trace_is_one_line_not_a_table_of_zeros(tmp_path: Path) -> None:
    for trace in _empty_traces(tmp_path):
        for args in (["sim", "--trace", str(trace)], ["doctor", str(trace)]):
            stderr = assert_short_failure(run_cli(*args), 2)
            assert "no requests" in stderr, args
            assert stderr.count("\n") == 1


def test_sim_with_invalid_yaml_or_unknown_fields_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\nb: {\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: x\nbogus: 1\nalso_bogus: 2\n")
    for scenario in (bad, unknown):
        stderr = assert_short_failure(run_cli("sim", "--scenario", str(scenario)), 2)
        assert stderr.count("\n") == 1, stderr
    whatif = tmp_path / "wp.yaml"
    whatif.write_text("bogus: 1\nother: 2\n")
    stderr = assert_short_failure(run_cli("fleet", "whatif", "--params", str(whatif)), 2)
    assert stderr.count("\n") == 1


def test_files_that_are_not_utf8_are_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(NOT_UTF8)
    for args in (
        ["cache", "ls", "--config", str(binary)],
        ["cache", "agent", "--config", str(binary)],
        ["fleet", "operator", "--kubeconfig", str(binary)],
    ):
        stderr = assert_short_failure(run_cli(*args, timeout_s=60), 2)
        assert "bin.yaml" in stderr, args


def test_whatif_checks_its_out_file_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "list.json"
    out.write_text("[1, 2]")
    started = time.monotonic()
    stderr = assert_short_failure(run_cli("fleet", "whatif", "--out", str(out)), 2)
    assert "not a JSON object" in stderr
    assert time.monotonic() - started < 5.0  # before the seconds of what-if work
    out.write_bytes(NOT_UTF8)
    assert "not JSON" in assert_short_failure(run_cli("fleet", "whatif", "--out", str(out)), 2)


class _NotVllm(BaseHTTPRequestHandler):
    answer = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def _server(answer: bytes) -> Iterator[str]:
    handler = type("Handler", (_NotVllm,), {"answer": answer})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize("answer", [{}, {"data": []}, [1], {"data": [7]}])
def test_conformance_against_a_server_that_is_not_vllm_is_one_line(answer: object) -> None:
    with _server(json.dumps(answer).encode()) as url:
        done = run_cli("conformance", "--engine", url, timeout_s=60)
    stderr = assert_short_failure(done, 2)
    assert "/v1/models" in stderr


# A shell's background job (CI started with ``nohup ... &``) has SIGINT ignored, and children
# inherit that: Python then never raises KeyboardInterrupt. A terminal's Ctrl-C meets the
# default action, which this restores before it runs the command.
WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def test_ctrl_c_is_one_line_with_the_shells_status(tmp_path: Path) -> None:
    scenario = Path(__file__).parents[2] / "examples" / "scenarios" / "gsp-large.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-c", WITH_DEFAULT_SIGINT, WARMFLEET, "sim", "--scenario", str(scenario)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # started: its first progress line
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "warmfleet sim: interrupted"
