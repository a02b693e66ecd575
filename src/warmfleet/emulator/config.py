"""Configuration of an emulated fleet (``apiVersion: warmfleet.dev/v1alpha1``, ``kind: Emulator``).

A fleet is ``instances`` identical engines (a preset, optionally with its KV capacity and block
size overridden, or a full ``engine`` spec) behind one port each, plus per-instance faults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from warmfleet.core.config import StrictModel, parse_document, validate_fields
from warmfleet.core.errors import ConfigError
from warmfleet.edge import load_yaml_file
from warmfleet.engine.presets import get_preset
from warmfleet.engine.spec import EngineSpec


class FaultSpec(StrictModel):
    """Faults of one instance; every probability is drawn from the instance's seeded RNG.

    - ``error_rate``: share of completion requests answered with HTTP 500 at once.
    - ``latency_spike_prob`` / ``latency_spike_ms``: share of completion requests delayed by
      ``latency_spike_ms`` (wall clock) before they reach the engine.
    - ``die_after_requests``: the instance accepts that many completion requests; the next one
      kills it (listener closed, every open connection reset, in-flight streams cut). The other
      instances of the process keep running.
    - ``hang``: every request (``/health`` too) is accepted and never answered.
    """

    error_rate: float = Field(0.0, ge=0.0, le=1.0)
    latency_spike_prob: float = Field(0.0, ge=0.0, le=1.0)
    latency_spike_ms: float = Field(0.0, ge=0.0)
    die_after_requests: int | None = Field(None, ge=0)
    hang: bool = False


class KvEventsSpec(StrictModel):
    """vLLM-compatible KV-cache events over ZMQ (see docs/emulator.md).

    Like vLLM with a concrete host, every instance *connects* a PUB socket to ``endpoint``, so
    one subscriber that binds there collects every instance. ``topic`` is the first frame, a
    template with ``{name}`` (``emu-<index>``), ``{index}`` and ``{port}``: the default
    ``kv.{name}`` names the instance the way the gateway's subscriber expects (``kv.<id>``).
    """

    endpoint: str = Field(min_length=1)
    topic: str = "kv.{name}"
    max_batch_events: int = Field(256, ge=1)
    # vLLM's replay socket (``replay_endpoint``): a ROUTER on the instance's host at its HTTP
    # port plus this offset, resending the last ``buffer_batches`` batches from a given seq.
    replay_port_offset: int | None = Field(None, ge=1, le=65534)
    buffer_batches: int = Field(10_000, ge=1)

    @model_validator(mode="after")
    def _check_topic(self) -> KvEventsSpec:
        try:
            self.topic.format(name="emu-0", index=0, port=1)
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"topic: bad template {self.topic!r}: {err}") from err
        return self


class EmulatorSpec(StrictModel):
    model: str = Field("warmfleet-emulated", min_length=1)
    preset: str = "tiny-cpu"
    engine: EngineSpec | None = None  # replaces the preset entirely
    kv_capacity_tokens: int | None = Field(None, ge=1)
    block_size: int | None = Field(None, ge=1, le=65_536)
    speedup: float = Field(1.0, gt=0.0, le=10_000.0)
    instances: int = Field(1, ge=1, le=256)
    host: str = "127.0.0.1"
    base_port: int = Field(0, ge=0, le=65_535)
    seed: int = 0
    hash_seed: int = 0
    eos_min_tokens: int = Field(8, ge=1)
    eos_max_tokens: int = Field(128, ge=1)
    faults: FaultSpec = Field(default_factory=FaultSpec)
    instance_faults: dict[int, FaultSpec] = Field(default_factory=dict)
    kv_events: KvEventsSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> EmulatorSpec:
        if self.eos_max_tokens < self.eos_min_tokens:
            raise ValueError("eosMaxTokens must be >= eosMinTokens")
        bad = [i for i in self.instance_faults if not 0 <= i < self.instances]
        if bad:
            raise ValueError(f"instanceFaults: no instance {bad[0]} (0..{self.instances - 1})")
        if self.base_port and self.base_port + self.instances - 1 > 65_535:
            raise ValueError("basePort + instances - 1 must be <= 65535")
        if self.engine is None:
            try:
                get_preset(self.preset)
            except ConfigError as err:
                raise ValueError(str(err)) from err
        return self

    def engine_spec(self) -> EngineSpec:
        """The effective engine: preset or ``engine``, with the overrides applied."""
        spec = self.engine if self.engine is not None else get_preset(self.preset)
        update: dict[str, int] = {}
        if self.kv_capacity_tokens is not None:
            update["kv_capacity_tokens"] = self.kv_capacity_tokens
        if self.block_size is not None:
            update["block_tokens"] = self.block_size
        if update:
            spec = EngineSpec.model_validate({**spec.model_dump(), **update})
        if spec.capacity_blocks < 1:
            raise ConfigError("kvCapacityTokens: smaller than one block")
        return spec

    def faults_for(self, index: int) -> FaultSpec:
        return self.instance_faults.get(index, self.faults)

    def port_for(self, index: int) -> int:
        return self.base_port + index if self.base_port else 0


class EmulatorDocument(StrictModel):
    apiVersion: Literal["warmfleet.dev/v1alpha1"]
    kind: Literal["Emulator"]
    spec: EmulatorSpec


def parse_emulator_document(data: object, source: str = "emulator") -> EmulatorSpec:
    return parse_document(EmulatorDocument, data, source).spec


def load_emulator_config(path: Path) -> EmulatorSpec:
    return parse_emulator_document(load_yaml_file(path), str(path))


def build_spec(**fields: object) -> EmulatorSpec:
    """An ``EmulatorSpec`` from keyword fields, ConfigError naming any bad field."""
    return validate_fields(EmulatorSpec, fields, "emulator")


def parse_fault_flag(flag: str) -> tuple[int, dict[str, str]]:
    """``INDEX:key=value,key=value`` (the ``--fault`` CLI flag) -> (index, raw fields)."""
    index_text, sep, rest = flag.partition(":")
    if not sep or not index_text.strip().isdigit():
        raise ConfigError(f"--fault {flag!r}: expected INDEX:key=value[,key=value...]")
    fields: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--fault {flag!r}: {item!r} is not key=value")
        fields[key.strip()] = value.strip()
    return int(index_text), fields
