"""The shape ``warmfleet status`` needs of ``state.json`` (``state.snapshot`` writes it), checked
before its tables are drawn: a file of another shape (edited, truncated into valid JSON, written
by another version) is one line naming the field, not a traceback.

Types are strict (``"5"`` is not a number here: the tables print the values as they are). Only
the fields the tables read are checked; the others (``history``, ``events``, what a newer ``up``
adds) are left alone, since state.json is written by ``up``, not a document a person writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warmfleet.core.config import error_path
from warmfleet.core.errors import ConfigError


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, populate_by_name=True)


class EndpointStatusView(_View):
    phase: str = ""
    revision: str = ""
    replicas: int = 0
    ready_replicas: int = Field(0, alias="readyReplicas")
    unprepared_replica_share: float | None = Field(0.0, alias="unpreparedReplicaShare")


class EndpointView(_View):
    name: str
    status: EndpointStatusView | None = None


class CacheView(_View):
    name: str
    source: dict[str, Any] = Field(default_factory=dict)
    status: dict[str, Any] | None = None


class NodeCacheView(_View):
    state: str
    bytes_done: int | None = Field(alias="bytesDone")
    bytes_total: int | None = Field(alias="bytesTotal")
    healthy: bool


class NodeView(_View):
    name: str
    agent_pid: int | None = Field(None, alias="agentPid")
    agent_up: bool = Field(False, alias="agentUp")
    budget_bytes: int | None = Field(alias="budgetBytes")
    ready_labels: list[str] = Field(alias="readyLabels")
    caches: dict[str, NodeCacheView] = Field(default_factory=dict)


class ReplicaView(_View):
    name: str
    node: str
    state: str
    load_source: str = Field(alias="loadSource")
    time_to_ready_s: float | None = Field(None, alias="timeToReadyS")
    url: str | None = None


class StartsView(_View):
    warm_start_s: float | None = Field(None, alias="warmStartS")
    cold_start_s: float | None = Field(None, alias="coldStartS")
    warm_weights_load_s: float | None = Field(None, alias="warmWeightsLoadS")
    cold_weights_load_s: float | None = Field(None, alias="coldWeightsLoadS")
    warm_starts: int = Field(0, alias="warmStarts")
    cold_starts: int = Field(0, alias="coldStarts")
    unprepared_replica_share: float | None = Field(None, alias="unpreparedReplicaShare")


class StateView(_View):
    """What the header line and the tables of ``warmfleet status`` read."""

    running: bool = False
    pid: int | None = None
    uptime_s: float | None = Field(None, alias="uptimeS")
    gateway: str | None = None
    origin: str | None = None
    endpoints: list[EndpointView] = Field(default_factory=list)
    caches: list[CacheView] = Field(default_factory=list)
    nodes: list[NodeView] = Field(default_factory=list)
    replicas: list[ReplicaView] = Field(default_factory=list)
    starts: StartsView = Field(default_factory=StartsView)


def check_state(doc: dict[str, Any], path: Path) -> None:
    """``doc`` (read from ``path``) has the shape ``render`` draws; a ConfigError naming the
    file and the first wrong fields otherwise."""
    try:
        StateView.model_validate(doc)
    except ValidationError as err:
        detail = "; ".join(f"{error_path(e, {}) or '<root>'}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"{path}: not the state `warmfleet up` writes: {detail}") from err
