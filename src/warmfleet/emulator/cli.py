"""`warmfleet emulate`: host an emulated vLLM fleet in this process until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from warmfleet.core.errors import ConfigError
from warmfleet.core.failures import DEBUG_META_KEY, EXPECTED_EXIT, expected_failure, one_line
from warmfleet.display import LogLevel
from warmfleet.edge import check_output_file
from warmfleet.emulator.config import (
    EmulatorSpec,
    build_spec,
    load_emulator_config,
    parse_fault_flag,
)
from warmfleet.emulator.fleet import EmulatedFleet
from warmfleet.emulator.weights import WeightsLoad, WeightsLoadError, load_weights


def _flag_overrides(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def build_cli_spec(
    *,
    config: Path | None,
    overrides: dict[str, Any],
    fault_overrides: dict[str, Any],
    fault_flags: list[str],
    kv_events_endpoint: str | None,
    kv_events_topic: str | None,
) -> EmulatorSpec:
    """The config file (if any) with every flag that was given applied on top."""
    base = load_emulator_config(config) if config is not None else EmulatorSpec()
    fields = base.model_dump(exclude_unset=True)
    fields.update(_flag_overrides(overrides))
    faults = {**base.faults.model_dump(exclude_unset=True), **_flag_overrides(fault_overrides)}
    fields["faults"] = faults
    per_instance = {i: f.model_dump(exclude_unset=True) for i, f in base.instance_faults.items()}
    for flag in fault_flags:
        index, raw = parse_fault_flag(flag)
        per_instance[index] = {**faults, **per_instance.get(index, {}), **raw}
    fields["instance_faults"] = per_instance
    # the file's kv_events with the flags on top; no topic anywhere: kv.{name}
    kv_events: dict[str, Any] = dict(fields.get("kv_events") or {})
    if kv_events_endpoint is not None:
        kv_events["endpoint"] = kv_events_endpoint
    if kv_events_topic is not None:
        if not kv_events:
            raise ConfigError(
                "--kv-events-topic needs --kv-events-endpoint (or kvEvents in --config)"
            )
        kv_events["topic"] = kv_events_topic
    if kv_events:
        fields["kv_events"] = kv_events
    return build_spec(**fields)


def _write_ports_file(path: Path, info: dict[str, Any]) -> None:
    """``info`` into ``path`` at once (written beside it, then renamed); the file beside it is
    removed when the rename fails (``--ports-file`` was checked before the start)."""
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)  # (the check allows a parent to be made)
    tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
    try:
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


async def serve_fleet(
    spec: EmulatorSpec,
    ready: Callable[[EmulatedFleet], None],
    weights_from: str | None = None,
    on_weights: Callable[[WeightsLoad], None] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if weights_from is not None:  # before any port is bound: not ready until loaded
            loaded = await load_weights(weights_from)
            if on_weights is not None:
                on_weights(loaded)
        async with EmulatedFleet(spec) as fleet:
            ready(fleet)
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return None
    return uvloop.new_event_loop


# The options that take more than a line, declared once here (module-level defaults, as B008
# asks), so the signature of `emulate` reads as its option list.
_SPEEDUP_OPTION = typer.Option(
    None, "--time-scale", "--speedup", help="Engine seconds per wall second (2 = 2x faster)."
)
_FAULT_OPTION = typer.Option(
    [], "--fault", help="Per-instance faults: INDEX:key=value[,key=value]; repeatable."
)
_KV_EVENTS_TOPIC_OPTION = typer.Option(
    None, help="Topic template of KV events ({name}, {index}, {port}); default kv.{name}."
)
# Paths are read here (readable=False): a refused read is one line, not click's box.
_CONFIG_OPTION = typer.Option(
    None, "--config", "-c", help="kind: Emulator document.", readable=False
)
_PORTS_FILE_OPTION = typer.Option(None, help="Write the ready JSON here too.", readable=False)
_LOAD_WEIGHTS_OPTION = typer.Option(
    None, help="Read every byte of this directory or http(s) URL before becoming ready."
)


def emulate_command(  # noqa: PLR0917
    ctx: typer.Context,
    instances: int | None = typer.Option(None, "--instances", "-n", help="Instances (ports)."),
    base_port: int | None = typer.Option(None, help="First port (0: free ports)."),
    host: str | None = typer.Option(None, help="Bind address (default 127.0.0.1)."),
    preset: str | None = typer.Option(None, help="tiny-cpu, llama-3.1-8b-h100, llama-3.1-70b-p5."),
    model: str | None = typer.Option(None, help="Served model name."),
    kv_capacity_tokens: int | None = typer.Option(None, help="Override the preset's KV size."),
    block_size: int | None = typer.Option(None, help="Override the KV block size (tokens)."),
    speedup: float | None = _SPEEDUP_OPTION,
    seed: int | None = typer.Option(None, help="Seed of the fault draws."),
    error_rate: float | None = typer.Option(None, help="Share of requests answered with 500."),
    latency_spike_prob: float | None = typer.Option(None, help="Share of requests delayed."),
    latency_spike_ms: float | None = typer.Option(None, help="Delay of a latency spike (ms)."),
    die_after_requests: int | None = typer.Option(None, help="Die on request N+1."),
    hang: bool | None = typer.Option(None, "--hang", help="Accept and never answer."),
    fault: list[str] = _FAULT_OPTION,
    kv_events_endpoint: str | None = typer.Option(None, help="ZMQ endpoint to connect to."),
    kv_events_topic: str | None = _KV_EVENTS_TOPIC_OPTION,
    config: Path | None = _CONFIG_OPTION,
    ports_file: Path | None = _PORTS_FILE_OPTION,
    log_level: LogLevel = typer.Option(LogLevel.warning, case_sensitive=False),  # noqa: B008
    load_weights_from: str | None = _LOAD_WEIGHTS_OPTION,
) -> None:
    """Serve an emulated vLLM fleet; prints one JSON line with the URLs once ready."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    overrides = {
        "instances": instances, "base_port": base_port, "host": host, "preset": preset,
        "model": model, "kv_capacity_tokens": kv_capacity_tokens, "block_size": block_size,
        "speedup": speedup, "seed": seed,
    }  # fmt: skip
    fault_overrides = {
        "error_rate": error_rate, "latency_spike_prob": latency_spike_prob,
        "latency_spike_ms": latency_spike_ms, "die_after_requests": die_after_requests,
        "hang": hang,
    }  # fmt: skip
    if ports_file is not None:  # before any port is bound: one line (the root command's)
        check_output_file(ports_file, "--ports-file")
    spec = _spec_or_exit(
        ctx,
        config=config,
        overrides=overrides,
        fault_overrides=fault_overrides,
        fault_flags=fault,
        kv_events_endpoint=kv_events_endpoint,
        kv_events_topic=kv_events_topic,
    )
    _serve(ctx, spec, ports_file, load_weights_from)


def _spec_or_exit(
    ctx: typer.Context,
    *,
    config: Path | None,
    overrides: dict[str, Any],
    fault_overrides: dict[str, Any],
    fault_flags: list[str],
    kv_events_endpoint: str | None,
    kv_events_topic: str | None,
) -> EmulatorSpec:
    """``build_cli_spec``; an invalid config is one line on stderr and the expected exit (its
    traceback under ``warmfleet --debug``)."""
    try:
        return build_cli_spec(
            config=config,
            overrides=overrides,
            fault_overrides=fault_overrides,
            fault_flags=fault_flags,
            kv_events_endpoint=kv_events_endpoint,
            kv_events_topic=kv_events_topic,
        )
    except ConfigError as err:
        if ctx.meta.get(DEBUG_META_KEY):  # `warmfleet --debug emulate`: the traceback
            raise
        print(f"warmfleet emulate: invalid emulator config: {one_line(str(err))}", file=sys.stderr)
        raise typer.Exit(EXPECTED_EXIT) from err


def _serve(
    ctx: typer.Context, spec: EmulatorSpec, ports_file: Path | None, load_weights_from: str | None
) -> None:
    """``_run``; under ``warmfleet --debug``, an expected failure's traceback in place of its
    one line."""
    try:
        _run(spec, ports_file, load_weights_from)
    except typer.Exit as done:  # an expected failure, told in one line
        if ctx.meta.get(DEBUG_META_KEY) and done.__cause__ is not None:
            raise done.__cause__ from None  # `warmfleet --debug emulate`: its traceback
        raise


def _run(spec: EmulatorSpec, ports_file: Path | None, load_weights_from: str | None) -> None:
    """Serve ``spec`` until stopped; print (and write) the ready JSON once every port listens."""
    weights: dict[str, Any] = {}

    def on_weights(loaded: WeightsLoad) -> None:
        weights.update(
            source=loaded.source, bytes_read=loaded.bytes_read, load_s=round(loaded.load_s, 4)
        )

    def ready(fleet: EmulatedFleet) -> None:
        info = fleet.ready_info()
        if weights:
            info["weights"] = weights
        if ports_file is not None:
            _write_ports_file(ports_file, info)
        print(json.dumps(info), flush=True)

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve_fleet(spec, ready, load_weights_from, on_weights))
    except WeightsLoadError as err:
        print(f"warmfleet emulate: cannot load the weights: {one_line(str(err))}", file=sys.stderr)
        raise typer.Exit(EXPECTED_EXIT) from err
    except OSError as err:
        line = expected_failure(err)
        if line is None:
            raise
        print(f"warmfleet emulate: cannot start the emulated fleet: {line}", file=sys.stderr)
        raise typer.Exit(EXPECTED_EXIT) from err


def register(app: typer.Typer) -> None:
    app.command("emulate")(emulate_command)
