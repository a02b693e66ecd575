"""Issue 21, "failures that must become loud and short": each command's expected failures, run as
a user runs them (the ``warmfleet`` script in a subprocess): exit 2 (1 for ``bench``'s failed
requests), at most 3 lines on stderr, no traceback unless ``--debug``."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_support import (
    WARMFLEET,
    assert_short_failure,
    busy_port,
    busy_port_above,
    closed_port,
    emulator,
    gateway,
    gateway_file,
    run_cli,
)

from support.fleets import pid_alive, small_fleet
from support.tokenizers import write_model

pytestmark = pytest.mark.e2e


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path) -> None:
    with busy_port() as port:
        config = gateway_file(tmp_path / "gateway.yaml", ["http://127.0.0.1:9"], port)
        stderr = assert_short_failure(run_cli("serve", "--config", str(config)), 2)
    assert stderr.count("\n") == 1
    assert stderr.startswith("warmfleet serve: ")
    assert "address already in use" in stderr
    assert str(port) in stderr


def test_serve_on_a_host_that_does_not_resolve_names_the_setting(tmp_path: Path) -> None:
    config = gateway_file(tmp_path / "gateway.yaml", ["http://127.0.0.1:9"])
    doc = yaml.safe_load(config.read_text())
    doc["spec"]["listen"]["host"] = "no-such-host.invalid"  # RFC 6761: never resolves
    config.write_text(yaml.safe_dump(doc))
    stderr = assert_short_failure(run_cli("serve", "--config", str(config)), 2)
    assert stderr.count("\n") == 1
    assert "spec.listen.host: cannot resolve 'no-such-host.invalid'" in stderr


def test_serve_with_a_busy_kv_event_port_is_one_line(tmp_path: Path) -> None:
    with busy_port() as port:
        config = gateway_file(tmp_path / "gateway.yaml", ["http://127.0.0.1:9"])
        doc = yaml.safe_load(config.read_text())
        doc["spec"]["tokenizerPath"] = str(write_model(tmp_path))
        doc["spec"]["kvEvents"] = {"endpoint": f"tcp://127.0.0.1:{port}"}
        variant = doc["spec"]["endpoints"][0]["variants"][0]
        variant["models"] = ["m"]
        variant["routing"]["key"] = {"mode": "tokens", "blockSize": 16}
        config.write_text(yaml.safe_dump(doc))
        stderr = assert_short_failure(run_cli("serve", "--config", str(config)), 2)
    assert stderr.count("\n") == 1
    assert stderr.startswith("warmfleet serve: ")
    assert f"spec.kvEvents.endpoint: cannot bind tcp://127.0.0.1:{port}" in stderr
    assert "Address already in use" in stderr
    assert stderr.count(str(port)) == 1  # not again in pyzmq's "(addr=...)"


def test_serve_that_cannot_reach_the_sync_keys_secret_is_one_line(tmp_path: Path) -> None:
    """The API server not answering is no invalid config: the line names the field and the
    server, and does not say "invalid config"."""
    config = gateway_file(tmp_path / "gateway.yaml", ["http://127.0.0.1:9"])
    doc = yaml.safe_load(config.read_text())
    api = f"http://127.0.0.1:{closed_port()}"
    secret = {"name": "gw-sync", "namespace": "serving", "apiServer": api, "timeoutS": 2.0}
    doc["spec"]["replicaSync"] = {
        "listen": {"port": closed_port()},
        "peers": {"type": "static", "endpoints": []},
        "curveSecret": secret,
    }
    config.write_text(yaml.safe_dump(doc))
    stderr = assert_short_failure(run_cli("serve", "--config", str(config)), 2)
    assert stderr.count("\n") == 1
    assert stderr.startswith("warmfleet serve: spec.replicaSync.curveSecret: ")
    assert "invalid config" not in stderr


@pytest.mark.parametrize("command", ["serve", "emulate"])
def test_debug_keeps_the_traceback(tmp_path: Path, command: str) -> None:
    with busy_port() as port:
        config = gateway_file(tmp_path / "gateway.yaml", ["http://127.0.0.1:9"], port)
        args = ["--config", str(config)] if command == "serve" else ["--base-port", str(port)]
        done = run_cli("--debug", command, *args)
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "address already in use" in done.stderr


def test_serve_with_a_bad_or_missing_config_is_one_line(tmp_path: Path) -> None:
    config = gateway_file(tmp_path / "gateway.yaml", ["http://127.0.0.1:9"])
    doc = yaml.safe_load(config.read_text())
    doc["spec"]["listen"]["port"] = -1
    doc["spec"]["listen"]["bogus"] = 1
    config.write_text(yaml.safe_dump(doc))
    stderr = assert_short_failure(run_cli("serve", "--config", str(config)), 2)
    assert stderr.count("\n") == 1
    assert "spec.listen.port" in stderr  # every field named, on one line
    assert "spec.listen.bogus" in stderr
    missing = assert_short_failure(run_cli("serve", "--config", str(tmp_path / "nope.yaml")), 2)
    assert "nope.yaml" in missing


def test_emulate_on_a_busy_port_is_one_line() -> None:
    with busy_port() as port:
        done = run_cli("emulate", "-n", "1", "--base-port", str(port), "--preset", "tiny-cpu")
    stderr = assert_short_failure(done, 2)
    assert stderr.count("\n") == 1
    assert "address already in use" in stderr


def test_emulate_on_a_busy_kv_event_replay_port_is_one_line(tmp_path: Path) -> None:
    base = closed_port()  # the HTTP port; the replay port is above it by the offset
    with busy_port_above(base) as replay_port:
        events = {
            "endpoint": f"tcp://127.0.0.1:{closed_port()}",
            "replayPortOffset": replay_port - base,
        }
        doc = {
            "apiVersion": "warmfleet.dev/v1alpha1",
            "kind": "Emulator",
            "spec": {"kvEvents": events},
        }
        config = tmp_path / "emulator.yaml"
        config.write_text(yaml.safe_dump(doc))
        done = run_cli("emulate", "--config", str(config), "-n", "1", "--base-port", str(base))
    stderr = assert_short_failure(done, 2)
    assert stderr.count("\n") == 1
    assert f"spec.kvEvents.replayPortOffset: cannot bind tcp://127.0.0.1:{replay_port}" in stderr
    assert "Address already in use" in stderr
    assert stderr.count(f"tcp://127.0.0.1:{replay_port}") == 1


def test_up_on_a_busy_gateway_port_is_one_line_and_stops_its_children(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    with busy_port() as port:
        path.write_text(yaml.safe_dump(small_fleet(tmp_path / "w", port)))
        stderr = assert_short_failure(run_cli("up", str(path)), 2)
    assert stderr.startswith("warmfleet up: ")
    assert "address already in use" in stderr
    final = json.loads((tmp_path / "w" / "state.json").read_text())
    assert final["running"] is False
    started = [final["originPid"]] + [n["agentPid"] for n in final["nodes"]]
    assert started
    assert not [pid for pid in started if pid is not None and pid_alive(int(pid))]


def test_up_with_a_missing_or_bad_fleet_file_is_one_line(tmp_path: Path) -> None:
    stderr = assert_short_failure(run_cli("up", str(tmp_path / "nope.yaml")), 2)
    assert "invalid fleet file" in stderr
    bad = tmp_path / "fleet.yaml"
    doc = small_fleet(tmp_path / "w", 0)
    doc["spec"]["nodes"][0]["budget"] = "lots"
    bad.write_text(yaml.safe_dump(doc))
    stderr = assert_short_failure(run_cli("up", str(bad)), 2)
    assert "spec.nodes.0.budget" in stderr


def _node_file(path: Path, root: Path, port: int) -> Path:
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "NodeCacheConfig",
        "spec": {
            "root": str(root),
            "capacity": {"budget": "64MiB", "reserve": "0"},
            "status": {"host": "127.0.0.1", "port": port},
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_cache_agent_failures_are_one_line(tmp_path: Path) -> None:
    missing = run_cli("cache", "agent", "--config", str(tmp_path / "node.yaml"))
    stderr = assert_short_failure(missing, 2)
    assert stderr.startswith("warmfleet cache agent: ")
    assert "node.yaml" in stderr
    with busy_port() as port:
        node = _node_file(tmp_path / "node.yaml", tmp_path / "cache", port)
        stderr = assert_short_failure(run_cli("cache", "agent", "--config", str(node)), 2)
    assert "address already in use" in stderr


def test_sim_with_a_missing_scenario_file_is_short(tmp_path: Path) -> None:
    done = run_cli("sim", "--scenario", str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in assert_short_failure(done, 2)


def test_bench_against_a_closed_port_fails_before_any_load() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    done = run_cli("bench", "--url", url, "--scenario", "gsp", "--requests", "5")
    stderr = assert_short_failure(done, 2)
    assert stderr.count("\n") == 1
    assert f"cannot reach {url}" in stderr
    assert done.stdout == ""  # no table of zeros: nothing was sent


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "localhost:8080", "ftp://127.0.0.1:21"])
def test_bench_with_a_url_without_http_scheme_is_one_line(url: str) -> None:
    done = run_cli("bench", "--url", url, "--scenario", "gsp", "--requests", "5")
    stderr = assert_short_failure(done, 2)
    assert stderr.count("\n") == 1
    assert "not an http(s) URL" in stderr
    assert done.stdout == ""


@pytest.mark.slow
def test_bench_through_the_gateway_picks_the_model_and_fails_loudly_on_a_wrong_one(
    tmp_path: Path,
) -> None:
    """The README's form (no --model) against a gateway in front of an emulator: the model is
    the one GET /v1/models lists. With a model nobody serves, every request fails: each error
    class and a sample message on stderr, exit 1 (0 with --max-error-share 1)."""
    with emulator() as engine_url, gateway(gateway_file(tmp_path / "gw.yaml", [engine_url])) as url:
        base = ["bench", "--url", url, "--scenario", "gsp", "--requests", "8"]
        base += ["--concurrency", "2", "--max-output-tokens", "4"]
        out = tmp_path / "ok.json"
        done = run_cli(*base, "--json", str(out))
        assert done.returncode == 0, done.stderr
        run = json.loads(out.read_text())["strategies"]["run"]
        assert run["requests"]["completed"] == 8
        assert run["errors"] == {}

        failed = run_cli(*base, "--model", "model", "--report", str(tmp_path / "bad"))
        stderr = assert_short_failure(failed, 1)
        assert "http_404: 8 of 8 requests" in stderr
        assert "model" in stderr.split("e.g.", 1)[1]  # the server's own message is the sample
        assert "--max-error-share" in stderr
        bad = json.loads((tmp_path / "bad" / "report.json").read_text())["strategies"]["run"]
        assert bad["errors"] == {"http_404": 8}
        assert bad["error_samples"]["http_404"].startswith("HTTP 404: ")
        assert (
            "- run: 8 x `http_404`, e.g. HTTP 404: " in (tmp_path / "bad" / "report.md").read_text()
        )

        tolerated = run_cli(*base, "--model", "model", "--max-error-share", "1")
        assert tolerated.returncode == 0, tolerated.stderr
        assert "http_404" in tolerated.stderr


@pytest.mark.slow
def test_fleet_render_does_not_overwrite_without_force(tmp_path: Path) -> None:
    fresh = run_cli("fleet", "render", "--out", str(tmp_path / "d"))
    assert fresh.returncode == 0, fresh.stderr
    crd = tmp_path / "d" / "crds" / "inferenceendpoints.warmfleet.dev.yaml"
    rendered = crd.read_text()
    again = run_cli("fleet", "render", "--out", str(tmp_path / "d"))  # same content: no harm
    assert again.returncode == 0, again.stderr
    crd.write_text("# my own edits\n")
    refused = run_cli("fleet", "render", "--out", str(tmp_path / "d"))
    stderr = assert_short_failure(refused, 2)
    assert "--force" in stderr
    assert str(crd) in stderr
    assert crd.read_text() == "# my own edits\n"
    forced = run_cli("fleet", "render", "--out", str(tmp_path / "d"), "--force")
    assert forced.returncode == 0, forced.stderr
    assert crd.read_text() == rendered


def test_fleet_render_default_leaves_an_existing_deploy_alone(tmp_path: Path) -> None:
    """``warmfleet fleet render`` in a directory whose ./deploy holds the user's own files."""
    mine = tmp_path / "deploy" / "manifests" / "warmfleet.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("kind: Mine\n")
    assert_short_failure(run_cli("fleet", "render", cwd=tmp_path), 2)
    assert mine.read_text() == "kind: Mine\n"


@pytest.mark.slow
def test_status_says_a_stopped_fleet_is_not_running(tmp_path: Path) -> None:
    """A real ``warmfleet up``: ``status`` shows it while it runs, and says it is not running
    once Ctrl-C stopped it (its last state still lists the endpoint Ready)."""
    path = tmp_path / "fleet.yaml"
    workdir = tmp_path / "w"
    path.write_text(yaml.safe_dump(small_fleet(workdir, 0)))
    up = subprocess.Popen([WARMFLEET, "up", str(path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):
            state = workdir / "state.json"
            doc = json.loads(state.read_text()) if state.exists() else {}
            if any(r.get("state") == "ready" for r in doc.get("replicas", [])):
                break
            assert up.poll() is None, "warmfleet up exited early"
            time.sleep(0.1)
        running = run_cli("status", "--workdir", str(workdir))
        assert running.returncode == 0, running.stderr
        assert "fleet running" in running.stdout
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    stopped = run_cli("status", "--workdir", str(workdir))
    stderr = assert_short_failure(stopped, 1)
    assert "not running" in stderr
    assert stopped.stdout == ""  # no tables of a fleet that is gone
    assert_short_failure(run_cli("status", str(path)), 1)  # found through the fleet file too
