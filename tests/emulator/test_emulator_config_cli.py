"""Emulator configuration, CLI flag merging, and `warmfleet emulate` as a real process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import typer
from typer.testing import CliRunner

from warmfleet.core.errors import ConfigError
from warmfleet.emulator.cli import build_cli_spec, register
from warmfleet.emulator.config import (
    EmulatorSpec,
    build_spec,
    load_emulator_config,
    parse_emulator_document,
    parse_fault_flag,
)
from warmfleet.engine.presets import get_preset


def _cli(**kwargs: Any) -> EmulatorSpec:
    defaults: dict[str, Any] = {
        "config": None,
        "overrides": {},
        "fault_overrides": {},
        "fault_flags": [],
        "kv_events_endpoint": None,
        "kv_events_topic": None,
    }
    defaults.update(kwargs)
    return build_cli_spec(**defaults)


def test_overrides_change_the_preset_only_where_asked() -> None:
    spec = build_spec(preset="llama-3.1-70b-p5", kv_capacity_tokens=50_000, block_size=32)
    engine = spec.engine_spec()
    preset = get_preset("llama-3.1-70b-p5")
    assert engine.kv_capacity_tokens == 50_000
    assert engine.block_tokens == 32
    assert engine.step_overhead_s == preset.step_overhead_s
    assert build_spec().engine_spec() == get_preset("tiny-cpu")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"preset": "gpt-9"}, "preset"),
        ({"speedup": 0}, "speedup"),
        ({"instances": 2, "instance_faults": {5: {}}}, "instanceFaults"),
        ({"faults": {"error_rate": 2}}, "faults.errorRate"),
        ({"bogus": 1}, "bogus"),
        ({"kv_events": {"endpoint": "tcp://127.0.0.1:1", "topic": "kv.{nope}"}}, "topic"),
    ],
)
def test_bad_config_names_the_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        build_spec(**fields)


def test_fault_flags_merge_per_instance() -> None:
    assert parse_fault_flag("2:error_rate=0.5,hang=true") == (
        2,
        {"error_rate": "0.5", "hang": "true"},
    )
    with pytest.raises(ConfigError):
        parse_fault_flag("x:error_rate=1")
    with pytest.raises(ConfigError):
        parse_fault_flag("1:error_rate")
    spec = _cli(
        overrides={"instances": 3, "speedup": 4.0, "preset": None},
        fault_overrides={"latency_spike_ms": 50.0, "error_rate": None},
        fault_flags=["1:error_rate=0.25", "2:die_after_requests=7"],
    )
    assert spec.instances == 3
    assert spec.faults_for(0).latency_spike_ms == 50.0
    assert spec.faults_for(0).error_rate == 0.0
    one = spec.faults_for(1)
    assert (one.error_rate, one.latency_spike_ms) == (0.25, 50.0)
    assert spec.faults_for(2).die_after_requests == 7


def test_config_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: Emulator\nspec:\n"
        "  instances: 4\n  kvCapacityTokens: 8192\n  faults: {errorRate: 0.1}\n"
    )
    assert load_emulator_config(path).instances == 4
    spec = _cli(config=path, overrides={"instances": 2}, kv_events_endpoint="tcp://127.0.0.1:9")
    assert spec.instances == 2
    assert spec.kv_capacity_tokens == 8192
    assert spec.faults.error_rate == 0.1
    assert spec.kv_events is not None
    assert spec.kv_events.endpoint == "tcp://127.0.0.1:9"
    with pytest.raises(ConfigError, match="kind"):
        parse_emulator_document({"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway"})


@pytest.mark.slow
@pytest.mark.e2e
async def test_warmfleet_emulate_prints_urls_and_stops_on_sigterm(tmp_path: Path) -> None:
    ports_file = tmp_path / "ports.json"
    exe = Path(sys.executable).with_name("warmfleet")
    argv = [str(exe), "emulate", "--instances", "3", "--block-size", "16"]
    argv += ["--time-scale", "10", "--ports-file", str(ports_file), "--fault", "2:error_rate=1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (or the process dies)
        info = json.loads(line)
        assert info["event"] == "ready"
        assert len(set(info["urls"])) == 3
        assert json.loads(ports_file.read_text()) == info
        async with aiohttp.ClientSession() as session:
            for url in info["urls"]:
                async with session.get(url + "/health") as resp:
                    assert resp.status == 200
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with session.post(info["urls"][2] + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 500
            async with session.post(info["urls"][0] + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_invalid_flags_exit_2() -> None:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A stand-in root, so ``emulate`` stays a subcommand."""

    register(app)
    result = CliRunner().invoke(app, ["emulate", "--preset", "nope"])
    assert result.exit_code == 2
    assert "preset" in result.output


def test_kv_events_flag_publishes_topics_the_gateway_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--kv-events-endpoint` alone must give each instance its own `kv.<name>` topic, the form
    the gateway's subscriber maps to an instance (a bare "kv" topic is dropped there)."""
    from warmfleet.emulator import cli as emulator_cli  # noqa: PLC0415
    from warmfleet.gateway.kv_events import instance_of_topic  # noqa: PLC0415

    served: list[EmulatorSpec] = []
    monkeypatch.setattr(emulator_cli, "_run", lambda spec, *_args: served.append(spec))
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """A stand-in root, so ``emulate`` stays a subcommand."""

    register(app)
    argv = ["emulate", "--instances", "2", "--kv-events-endpoint", "tcp://127.0.0.1:9"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    kv_events = served[0].kv_events
    assert kv_events is not None
    topics = [kv_events.topic.format(name=f"emu-{i}", index=i, port=1) for i in range(2)]
    assert [instance_of_topic(t) for t in topics] == ["emu-0", "emu-1"]
    # an explicit topic still wins
    served.clear()
    result = CliRunner().invoke(app, [*argv, "--kv-events-topic", "kv.{index}"])
    assert result.exit_code == 0, result.output
    assert served[0].kv_events is not None
    assert served[0].kv_events.topic == "kv.{index}"
    # a topic with nowhere to publish is an error, not a flag silently dropped
    served.clear()
    result = CliRunner().invoke(app, ["emulate", "--kv-events-topic", "kv.{index}"])
    assert result.exit_code == 2
    assert "--kv-events-endpoint" in result.output
    assert served == []
