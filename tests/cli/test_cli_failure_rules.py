"""The rules behind the loud, short failures: which exceptions are expected (one line, exit 2)
and which are bugs (traceback), bench's URL and model checks and error verdict, and how
``warmfleet status`` decides a fleet is not running."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from cli_support import assert_short_failure, busy_port, closed_port, run_cli
from typer.testing import CliRunner

from warmfleet.bench.loadgen_errors import error_lines, http_error_detail, too_many_errors
from warmfleet.bench.loadgen_preflight import PreflightError, check_base_url, choose_model
from warmfleet.cli import LoudGroup
from warmfleet.core.errors import ConfigError, NotFoundError
from warmfleet.core.failures import expected_failure, one_line
from warmfleet.local.state import not_running_reason


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (OSError(errno.EADDRINUSE, "address already in use"), "address already in use"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x.yaml"), "/x.yaml"),
        (PermissionError(errno.EACCES, "Permission denied", "/root/x"), "Permission denied"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "Connection refused"),
        (TimeoutError(), "timed out"),
        (ConfigError("a.yaml: spec.x: bad\na.yaml: spec.y: worse"), "spec.x: bad; a.yaml: spec.y"),
        (NotFoundError("no such model"), "no such model"),
        (ExceptionGroup("g", [OSError(errno.EADDRINUSE, "in use")]), "in use"),
    ],
)
def test_expected_failures_are_one_line(err: BaseException, expected: str) -> None:
    line = expected_failure(err)
    assert line is not None
    assert "\n" not in line
    assert expected in line
    assert "[Errno" not in line


@pytest.mark.parametrize(
    "err",
    [
        ValueError("bug"),
        KeyError("bug"),
        AttributeError("bug"),
        OSError(errno.EBADF, "Bad file descriptor"),  # the program's own mistake
        OSError("raised by code without an errno"),
        ExceptionGroup("g", [OSError(errno.EADDRINUSE, "in use"), ValueError("bug")]),
        KeyboardInterrupt(),
    ],
)
def test_bugs_are_not_expected(err: BaseException) -> None:
    assert expected_failure(err) is None


def test_one_line_is_bounded() -> None:
    assert one_line("a\n\n  b   c\n") == "a; b c"
    assert len(one_line("x" * 5000)) == 600


def _app() -> typer.Typer:
    app = typer.Typer(cls=LoudGroup)
    sub = typer.Typer()

    @app.command("busy")
    def busy() -> None:
        raise OSError(errno.EADDRINUSE, "error while attempting to bind: address already in use")

    @app.command("bug")
    def bug() -> None:
        raise ValueError("a real bug")

    @sub.command("leaf")
    def leaf() -> None:
        raise ConfigError("node.yaml: spec.root: Field required")

    app.add_typer(sub, name="grp")
    return app


def test_root_group_prints_expected_failures_as_one_line_and_keeps_bugs() -> None:
    runner = CliRunner()
    busy = runner.invoke(_app(), ["busy"])
    assert busy.exit_code == 2
    assert busy.output == "warmfleet busy: error while attempting to bind: address already in use\n"
    nested = runner.invoke(_app(), ["grp", "leaf"])
    assert nested.exit_code == 2
    assert nested.output == "warmfleet grp leaf: node.yaml: spec.root: Field required\n"
    bug = runner.invoke(_app(), ["bug"])
    assert bug.exit_code == 1
    assert isinstance(bug.exception, ValueError)  # not swallowed: typer shows its traceback


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:8080",
        "localhost:8080",
        "ftp://h/",
        "http://",
        "http://h:0",
        "http://h:99999",
        "http://h/?q=1",
    ],
)
def test_check_base_url_refuses_what_is_not_an_http_base_url(url: str) -> None:
    with pytest.raises(PreflightError, match="--url"):
        check_base_url(url)


def test_check_base_url_keeps_a_base_url() -> None:
    assert check_base_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert check_base_url("https://router.example/prefix") == "https://router.example/prefix"


def test_choose_model_takes_the_one_listed_model_or_asks_for_it() -> None:
    assert choose_model([("http://a", ["m"])]) == "m"
    assert choose_model([("http://a", ["m", "x"]), ("http://b", ["y", "m"])]) == "m"
    with pytest.raises(PreflightError, match=r"http://a serves 2 models \(m, x\): pass --model"):
        choose_model([("http://a", ["m", "x"])])
    with pytest.raises(PreflightError, match="serves no model: pass --model"):
        choose_model([("http://a", [])])
    with pytest.raises(PreflightError, match="in common"):
        choose_model([("http://a", ["m"]), ("http://b", ["x"])])
    with pytest.raises(PreflightError, match="HTTP 404: pass --model"):
        choose_model([("http://a", "GET http://a/v1/models answered HTTP 404")])


def test_http_error_detail_is_the_servers_message() -> None:
    envelope = json.dumps({"error": {"message": "The model `model` does not exist."}}).encode()
    assert http_error_detail(404, envelope) == "HTTP 404: The model `model` does not exist."
    html = http_error_detail(502, b"<html>\nBad\ngateway</html>")
    assert html == "HTTP 502: <html>; Bad; gateway</html>"
    assert http_error_detail(500, b"") == "HTTP 500: (empty body)"
    assert len(http_error_detail(500, b"x" * 100_000)) <= 200


def _summary(errors: dict[str, int], completed: int) -> dict[str, object]:
    rejected = sum(errors.values())
    samples = {name: f"sample {name}" for name in errors}
    requests = {"completed": completed, "rejected": rejected}
    return {"errors": errors, "error_samples": samples, "requests": requests}


def test_error_verdict_follows_max_error_share() -> None:
    clean = _summary({}, 10)
    assert too_many_errors(clean, 0.0) is None
    assert error_lines(clean) == []
    one = _summary({"http_500": 1}, 9)
    assert too_many_errors(one, 0.0) == (
        "1 of 10 requests failed (10.0 %), more than --max-error-share 0"
    )
    assert too_many_errors(one, 0.1) is None  # "more than" the share
    assert too_many_errors(one, 0.05) is not None
    lines = error_lines(_summary({"timeout": 1, "http_404": 3}, 0))
    assert lines == [
        "error http_404: 3 of 4 requests (75 %), e.g. sample http_404",
        "error timeout: 1 of 4 requests (25 %), e.g. sample timeout",
    ]
    assert too_many_errors(_summary({}, 0), 1.0) is not None  # nothing sent: nothing measured


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_not_running_reason() -> None:
    gateway = f"http://127.0.0.1:{closed_port()}"
    assert not_running_reason({"running": False, "pid": os.getpid()}) == "it was stopped"
    dead = _dead_pid()
    assert not_running_reason({"running": True, "pid": dead, "gateway": gateway}) == (
        f"its process (pid {dead}) is gone"
    )
    reason = not_running_reason({"running": True, "pid": os.getpid(), "gateway": gateway})
    assert reason is not None
    assert "does not accept connections" in reason
    with busy_port() as port:
        alive = {"running": True, "pid": os.getpid(), "gateway": f"http://0.0.0.0:{port}"}
        assert not_running_reason(alive) is None


def test_status_of_a_killed_fleet_is_not_running(tmp_path: Path) -> None:
    """``up`` killed (no clean stop): its state still says running and Ready; ``status`` checks
    the process it recorded."""
    state = {
        "running": True,
        "pid": _dead_pid(),
        "gateway": f"http://127.0.0.1:{closed_port()}",
        "endpoints": [{"name": "m", "status": {"phase": "Ready", "readyReplicas": 1}}],
    }
    (tmp_path / "state.json").write_text(json.dumps(state))
    done = run_cli("status", "--workdir", str(tmp_path))
    stderr = assert_short_failure(done, 1)
    assert "the fleet is not running" in stderr
    assert "Ready" not in done.stdout
