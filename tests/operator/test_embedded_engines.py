"""``engine.type`` of the embedded fleet: the emulator (default) or a real vLLM server per
replica under ``local.engine_proc``, and ``directory`` models the agents fill caches from."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.fleets import pid_alive, small_fleet
from warmfleet.core.errors import ConfigError
from warmfleet.local.config import (
    DirectoryModel,
    EmulatorEngine,
    VllmEngine,
    model_location,
    parse_fleet,
)
from warmfleet.local.replicas import vllm_argv


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    return model


def _vllm_fleet(tmp_path: Path, **engine: Any) -> dict[str, Any]:
    python = tmp_path / "python"
    python.write_text("")
    doc: dict[str, Any] = small_fleet(tmp_path / "w")
    spec = doc["spec"]
    spec["origin"]["models"] = [
        {"type": "directory", "name": "m", "path": str(_model_dir(tmp_path)), "revisions": ["v1"]}
    ]
    spec["engine"] = {"type": "vllm", "python": str(python), **engine}
    return doc


def test_engine_defaults_to_the_emulator_and_models_to_synthetic(tmp_path: Path) -> None:
    spec = parse_fleet(small_fleet(tmp_path)).spec
    assert isinstance(spec.engine, EmulatorEngine)
    assert spec.origin.models[0].type == "synthetic"
    assert model_location(spec, "http://o", "origin://m", "v1") == "http://o/files/m-v1.bin"


def test_a_vllm_fleet_loads_directory_models(tmp_path: Path) -> None:
    spec = parse_fleet(_vllm_fleet(tmp_path, kvCacheBlocks=48, extraArgs=["--seed", "1"])).spec
    assert isinstance(spec.engine, VllmEngine)
    model = spec.origin.models[0]
    assert isinstance(model, DirectoryModel)
    assert model_location(spec, "http://o", "origin://m", "v1") == str(tmp_path / "tiny")
    argv = vllm_argv(spec.engine, "m", "/cache/objects/k")
    assert argv[0] == str(tmp_path / "python")
    assert argv[argv.index("--model") + 1] == "/cache/objects/k"
    assert argv[argv.index("--served-model-name") + 1] == "m"
    assert argv[argv.index("--port") + 1] == "{port}"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--num-gpu-blocks-override") + 1] == "48"
    assert argv[-2:] == ["--seed", "1"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["spec"]["engine"].update(type="tgi"), "tgi"),
        (lambda d: d["spec"]["engine"].update(python="/nonexistent/python"), "python"),
        (lambda d: d["spec"]["engine"].update(preset="tiny-cpu"), "preset"),
        (
            lambda d: d["spec"]["origin"]["models"][0].update(path="/nonexistent"),
            "not a model directory",
        ),
        (
            lambda d: d["spec"]["origin"]["models"].__setitem__(
                0, {"name": "m", "size": 10, "revisions": ["v1"]}
            ),
            "endpoints.0.spec.modelSource: engine.type vllm",
        ),
        (
            lambda d: d["spec"]["endpoints"][0]["spec"]["variants"][0].update(
                standby={"engine": "asleep"}
            ),
            "variants.0.standby.engine",
        ),
    ],
)
def test_invalid_engine_configs_are_rejected_naming_the_field(
    tmp_path: Path, change: Any, message: str
) -> None:
    doc = _vllm_fleet(tmp_path)
    change(doc)
    with pytest.raises(ConfigError, match=message):
        parse_fleet(doc)


# A stand-in server: answers /health 200 on the port it is given, until SIGTERM.
FAKE_SERVER = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _supervisor(tmp_path: Path, *command: str) -> tuple[subprocess.Popen[bytes], Path]:
    ready = tmp_path / "ready.json"
    argv = [sys.executable, "-m", "warmfleet.local.engine_proc", "--ready-file", str(ready)]
    argv += ["--model-dir", str(_model_dir(tmp_path)), "--", *command]
    return subprocess.Popen(argv), ready


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"supervisor exited ({proc.returncode})"
        assert time.monotonic() < deadline, "no ready file"
        time.sleep(0.05)
    return json.loads(path.read_text())


@pytest.mark.slow
def test_the_supervisor_announces_a_healthy_server_and_stops_its_group(tmp_path: Path) -> None:
    proc, ready = _supervisor(tmp_path, sys.executable, "-c", FAKE_SERVER, "{port}")
    try:
        info = _wait_for(ready, proc)
        assert info["pid"] == proc.pid
        assert info["urls"][0].startswith("http://127.0.0.1:")
        assert info["weights"]["bytes_read"] == 1002  # config.json + the safetensors
        server_pid = int(
            subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=True
            ).stdout.split()[0]
        )
        assert pid_alive(server_pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        deadline = time.monotonic() + 5
        while pid_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(server_pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_server_that_exits_fails_the_supervisor(tmp_path: Path) -> None:
    proc, ready = _supervisor(tmp_path, sys.executable, "-c", "raise SystemExit(3)")
    assert proc.wait(timeout=30) == 3
    assert not ready.exists()


def test_the_vllm_example_is_valid_once_the_venv_and_model_exist() -> None:
    repo = Path(__file__).resolve().parents[2]
    example = repo / "examples" / "fleet-vllm.yaml"
    built = (repo / ".venv-vllm/bin/python").is_file() and (repo / ".cache/tiny-llama").is_dir()
    doc = yaml.safe_load(example.read_text())
    cwd = Path.cwd()
    os.chdir(repo)  # its paths are relative to the directory `warmfleet up` runs in
    try:
        if built:
            assert isinstance(parse_fleet(doc).spec.engine, VllmEngine)
        else:
            with pytest.raises(ConfigError, match=r"make vllm-|not a model directory"):
                parse_fleet(doc)
    finally:
        os.chdir(cwd)
