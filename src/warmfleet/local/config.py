"""``kind: LocalFleet`` (``warmfleet up fleet.yaml``): nodes, a model origin, the engine, the
gateway and the InferenceEndpoints, in one versioned document.

Model sources use ``origin://<model>`` with a ``revision`` listed under ``origin.models``. A
``synthetic`` model (the default ``type``) is a generated file per revision that the local HTTP
origin serves (throttled); a ``directory`` model is a model directory on this machine (e.g. the
tiny Llama ``make vllm-model`` builds), which the agents fill their caches from and a cold
replica loads directly. ``engine.type`` is ``emulator`` (default: ``warmfleet emulate``, any
model) or ``vllm`` (a real vLLM server per replica from ``engine.python``'s environment, which
needs ``directory`` models).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, Self

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from warmfleet.api.resources import MAX_ENDPOINT_NAME, InferenceEndpointSpec, WireModel
from warmfleet.cache.config import Size
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.edge import load_yaml_file

ORIGIN_SCHEME = "origin://"


class NodeConfig(WireModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    budget: Size = Field(description="disk budget of the node cache (bytes or '1GiB')")
    labels: dict[str, str] = Field(default_factory=dict)


MODEL_NAME_PATTERN = r"^[a-z0-9][-a-z0-9_.]*$"


class SyntheticModel(WireModel):
    type: Literal["synthetic"] = "synthetic"
    name: str = Field(pattern=MODEL_NAME_PATTERN, max_length=64)
    size: Size = Field(gt=0, description="bytes of each revision's weights file")
    # a revision names the origin's file <name>-<revision>.bin
    revisions: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")], ...] = Field(
        min_length=1
    )


class DirectoryModel(WireModel):
    """A model directory on this machine (config, tokenizer, safetensors): the agents fill their
    caches from it (``origin.throttle`` does not apply) and a cold replica loads it directly."""

    type: Literal["directory"]
    name: str = Field(pattern=MODEL_NAME_PATTERN, max_length=64)
    path: str = Field(min_length=1, description="the model directory (relative to the cwd)")
    revisions: tuple[str, ...] = Field(default=("local",), min_length=1, max_length=1)

    @field_validator("path")
    @classmethod
    def _is_model_dir(cls, value: str) -> str:
        path = Path(value).resolve()
        if not (path / "config.json").is_file():
            raise ValueError(f"{value} is not a model directory (no config.json in {path})")
        return str(path)


def _tag_or(default: str) -> Any:
    """A discriminator on ``type`` that takes ``default`` when ``type`` is absent."""

    def tag(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get("type", default))
        return str(getattr(value, "type", default))

    return Discriminator(tag)


Model = Annotated[
    Annotated[SyntheticModel, Tag("synthetic")] | Annotated[DirectoryModel, Tag("directory")],
    _tag_or("synthetic"),
]


class OriginConfig(WireModel):
    throttle: Size | None = Field(
        default=100_000_000, description="origin bytes/s over all connections; null = unlimited"
    )
    models: tuple[Model, ...] = Field(min_length=1)


class _EngineCommon(WireModel):
    replicas_per_node: int = Field(default=2, ge=1)
    start_timeout_s: float = Field(default=120.0, gt=0)
    crash_backoff_s: float = Field(default=10.0, ge=0)
    crash_backoff_max_s: float = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _backoff_cap_not_below_start(self) -> Self:
        if self.crash_backoff_max_s < self.crash_backoff_s:
            raise ValueError(
                "crashBackoffMaxS: must be at least crashBackoffS (the first wait doubles up to it)"
            )
        return self


class EmulatorEngine(_EngineCommon):
    """``warmfleet emulate``: reads every weights byte, then serves the preset's timings."""

    type: Literal["emulator"] = "emulator"
    preset: str = "tiny-cpu"
    speedup: float = Field(default=20.0, gt=0)


class VllmEngine(_EngineCommon):
    """A real vLLM OpenAI server per replica (``vllm.entrypoints.openai.api_server``), started
    with ``--model`` at the node cache's published directory (warm node) or the model directory
    (cold node), on 127.0.0.1, with prefix caching on (docs/real-vllm.md)."""

    type: Literal["vllm"]
    python: str = Field(
        default=".venv-vllm/bin/python", description="the interpreter vLLM is installed in"
    )
    replicas_per_node: int = Field(default=1, ge=1)
    start_timeout_s: float = Field(default=600.0, gt=0)
    max_model_len: int = Field(default=4096, gt=0)
    dtype: str = Field(default="float32", pattern=r"^[a-z0-9_]+$")
    kv_cache_blocks: int | None = Field(default=None, gt=0, description="--num-gpu-blocks-override")
    kv_cache_space_gib: int = Field(default=1, ge=1, description="VLLM_CPU_KVCACHE_SPACE")
    extra_args: tuple[str, ...] = ()

    @field_validator("python")
    @classmethod
    def _python_exists(cls, value: str) -> str:
        path = Path(value).absolute()
        if not path.is_file():
            raise ValueError(f"{path} does not exist (make vllm-venv builds .venv-vllm)")
        return str(path)


EngineConfig = Annotated[
    Annotated[EmulatorEngine, Tag("emulator")] | Annotated[VllmEngine, Tag("vllm")],
    _tag_or("emulator"),
]


class GatewayPorts(WireModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    poll_interval_s: float = Field(default=0.2, gt=0)
    # the gateway's zero-ready hold (scale from zero): requests wait this long for a replica
    hold_timeout_s: float = Field(default=120.0, gt=0)
    max_held_per_variant: int = Field(default=64, ge=1)


class PeersConfig(WireModel):
    """Peer-to-peer weight distribution between the node agents (docs/peer-distribution.md)."""

    enabled: bool = False
    origin_fetches: int = Field(default=1, ge=1, description="origin copies per piece (k)")
    piece_bytes: Size = Field(default=16 * 2**20, gt=0)
    serve_bps: Size = Field(default=500_000_000, gt=0, description="upload bytes/s per node")
    max_uploads_per_peer: int = Field(default=6, ge=1)
    origin_streams: int = Field(default=12, ge=1, description="origin fetches at once, fleet-wide")
    stall_s: float = Field(default=2.0, gt=0, description="a peer silent this long is dropped")
    # A filling node reports at least this often (it renews its fetches and shows it is alive),
    # and a node serving a version after its fill renews it this often.
    renew_s: float = Field(default=10.0, gt=0, description="a live node's longest silence")

    @property
    def tracker_stall_s(self) -> float:
        """The tracker's stall bound: an assignment not renewed, or a filling node silent,
        this long is taken for dead (``TrackerOptions.stall_s``)."""
        return tracker_stall_s(self.stall_s)

    @field_validator("renew_s")
    @classmethod
    def _renew_within_the_bound(cls, value: float, info: ValidationInfo) -> float:
        stall_s = info.data.get("stall_s")
        if stall_s is None:  # stallS itself is invalid: reported on its own
            return value
        bound = tracker_stall_s(stall_s)
        if value > bound / 2:
            raise ValueError(
                f"must be at most half the tracker's stall bound, max(30, 10 x stallS) = "
                f"{bound:g} s (a report may be late by a failed ask and its retry wait), "
                f"got {value:g}"
            )
        return value


def tracker_stall_s(stall_s: float) -> float:
    """The embedded tracker's stall bound for a fleet whose ``peers.stallS`` is ``stall_s``."""
    return max(30.0, 10 * stall_s)


class EndpointEntry(WireModel):
    # a DNS label, as an InferenceEndpoint's name: it names files under the workdir
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=MAX_ENDPOINT_NAME)
    spec: InferenceEndpointSpec


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def _check_unique(what: str, items: Sequence[_Named]) -> None:
    names = [item.name for item in items]
    if len(set(names)) != len(names):
        raise ValueError(f"{what} names must be unique, got {names}")


class LocalFleetSpec(WireModel):
    workdir: str = ".warmfleet/fleet"
    nodes: tuple[NodeConfig, ...] = Field(min_length=1)
    origin: OriginConfig
    engine: EngineConfig = Field(default_factory=EmulatorEngine)
    gateway: GatewayPorts = Field(default_factory=GatewayPorts)
    reconcile_interval_s: float = Field(default=0.5, gt=0)
    agent_restart_delay_s: float = Field(default=2.0, ge=0)
    drain_grace_s: float = Field(default=1.0, ge=0)
    peers: PeersConfig = Field(default_factory=PeersConfig)
    endpoints: tuple[EndpointEntry, ...] = ()

    @field_validator("nodes", "endpoints")
    @classmethod
    def _unique_names(cls, value: tuple[_Named, ...], info: ValidationInfo) -> tuple[_Named, ...]:
        _check_unique(str(info.field_name).removesuffix("s"), value)
        return value

    @model_validator(mode="after")
    def _sources_exist(self) -> LocalFleetSpec:
        _check_unique("origin.models: model", self.origin.models)
        for i, entry in enumerate(self.endpoints):
            source = entry.spec.model_source
            if not source.uri.startswith(ORIGIN_SCHEME):
                raise ValueError(f"endpoints.{i}.spec.modelSource.uri: use origin://<model>")
            model = self.model(source.uri[len(ORIGIN_SCHEME) :])
            if model is None or source.revision not in model.revisions:
                raise ValueError(
                    f"endpoints.{i}.spec.modelSource: {source.uri}@{source.revision} is not "
                    "listed under origin.models"
                )
            if self.engine.type == "vllm" and model.type != "directory":
                raise ValueError(
                    f"endpoints.{i}.spec.modelSource: engine.type vllm loads real weights, but "
                    f"{source.uri} is a synthetic model (give it type: directory and a path)"
                )
            for j, variant in enumerate(entry.spec.variants):
                if self.engine.type == "vllm" and variant.standby.engine == "asleep":
                    raise ValueError(
                        f"endpoints.{i}.spec.variants.{j}.standby.engine: asleep needs the "
                        "emulator (vLLM's sleep mode needs a GPU); use none"
                    )
        return self

    def model(self, name: str) -> SyntheticModel | DirectoryModel | None:
        return next((m for m in self.origin.models if m.name == name), None)


class LocalFleet(WireModel):
    api_version: Literal["warmfleet.dev/v1alpha1"] = "warmfleet.dev/v1alpha1"
    kind: Literal["LocalFleet"] = "LocalFleet"
    spec: LocalFleetSpec


def origin_file(model: str, revision: str) -> str:
    """The origin's file name of one model revision."""
    return f"{model}-{revision}.bin"


def origin_path(uri: str, revision: str) -> str:
    """``origin://m`` at ``revision`` -> the path under the origin's ``/files/``."""
    if not uri.startswith(ORIGIN_SCHEME):
        raise ConfigError(f"model source {uri!r}: the embedded fleet serves origin://<model> only")
    return origin_file(uri[len(ORIGIN_SCHEME) :], revision)


def origin_url_of(origin_url: str, uri: str, revision: str) -> str:
    """The URL the origin at ``origin_url`` serves ``origin://m`` at ``revision`` from."""
    return f"{origin_url}/files/{origin_path(uri, revision)}"


def model_location(spec: LocalFleetSpec, origin_url: str, uri: str, revision: str) -> str:
    """Where ``origin://m`` at ``revision`` comes from: a ``directory`` model's path, else the
    URL the origin at ``origin_url`` serves the synthetic file from."""
    model = spec.model(uri[len(ORIGIN_SCHEME) :]) if uri.startswith(ORIGIN_SCHEME) else None
    if isinstance(model, DirectoryModel):
        return model.path
    return origin_url_of(origin_url, uri, revision)


def parse_fleet(data: object, source: str = "fleet.yaml") -> LocalFleet:
    return parse_document(LocalFleet, data, source)


def load_fleet(path: Path) -> LocalFleet:
    return parse_fleet(load_yaml_file(path), str(path))
