"""What the simulator kernel is given and what it reports (pure data).

``SimConfig`` and ``ScaleEvent`` describe a run; ``RequestRecord``, ``ScaleRecord``,
``JoinRecord`` and ``SimResult`` are its outcome, in virtual seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from warmfleet.core.types import InstanceId, RoutingKey
from warmfleet.engine.spec import EngineSpec
from warmfleet.sim.kv_feed import KvEventsSim
from warmfleet.sim.workloads.base import WorkloadRequest


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """At ``at_s``, add a new instance or remove ``instance_id`` (default: the newest one)."""

    at_s: float
    action: Literal["add", "remove"]
    instance_id: InstanceId | None = None


@dataclass(frozen=True, slots=True)
class SimConfig:
    """``instances`` ready at time 0 (0 only with a fleet controller that starts them)."""

    instances: int
    engine: EngineSpec
    router_overhead_s: float = 0.0015
    concurrency: int | None = None  # closed loop with this many clients; None = open loop
    scale_events: tuple[ScaleEvent, ...] = ()
    check_invariants: bool = False  # engine/pool consistency after every event (tests)
    kv_events: KvEventsSim | None = None  # the engines publish KV events (``sim.kv_feed``)


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request (times in virtual seconds)."""

    index: int
    prompt_tokens: int
    output_tokens: int
    arrival_s: float = -1.0  # when it was sent to the router
    instance_id: InstanceId = ""
    reason: str = ""
    spilled: bool = False
    available_tokens: int = 0  # best instance's actual cached prefix at decision time
    captured_tokens: int = 0  # chosen instance's actual cached prefix at decision time
    first_token_s: float = -1.0
    cached_tokens: int = 0  # engine-delivered cached prefix
    finish_s: float = -1.0
    rejected: bool = False  # refused by the engine, or shed by flow control
    shed_status: int = 0  # flow control answered it without serving it (429/503); 0 = no
    queued_s: float = 0.0  # time it waited in flow control's queue
    predicted_ttft_s: float = -1.0  # flow control's engine-side TTFT prediction at dispatch

    @property
    def done(self) -> bool:
        return self.finish_s >= 0


@dataclass(frozen=True, slots=True)
class ScaleRecord:
    """The routable instance set changed at ``at_s`` (scale event, or a started one ready)."""

    at_s: float
    before_ids: tuple[InstanceId, ...]
    after_ids: tuple[InstanceId, ...]


@dataclass(frozen=True, slots=True)
class JoinRecord:
    """An instance a fleet controller started at ``started_s``; it took traffic from
    ``ready_s``. ``tag`` is the controller's own name for it (opaque to the kernel)."""

    instance_id: InstanceId
    started_s: float
    ready_s: float
    tag: str


@dataclass(slots=True)
class SimResult:
    records: list[RequestRecord]
    instance_ids: list[InstanceId]  # every instance that ever existed, in creation order
    scale_records: list[ScaleRecord] = field(default_factory=list)
    end_s: float = 0.0
    time_trace_ok: bool = True  # virtual time never went back
    # per request: blocks its answer completes, as re-sent by the session's next turn
    output_block_hashes: list[tuple[int, ...]] = field(default_factory=list)
    joins: list[JoinRecord] = field(default_factory=list)  # started by the fleet controller


def continuation_blocks(
    keys: Sequence[RoutingKey],
    requests: Sequence[WorkloadRequest],
    next_turn: dict[int, int],
    block_tokens: int,
) -> list[tuple[int, ...]]:
    """Hashes of the full blocks each request's output completes, when its session's next turn
    starts with this prompt (then the next turn's blocks are the continuation of the chain)."""
    out: list[tuple[int, ...]] = [()] * len(keys)
    for index, nxt in next_turn.items():
        mine, theirs = keys[index].block_hashes, keys[nxt].block_hashes
        if theirs[: len(mine)] != mine:
            continue
        end = (requests[index].prompt_tokens + requests[index].output_tokens) // block_tokens
        out[index] = theirs[len(mine) : end]
    return out


def plan_sessions(requests: Sequence[WorkloadRequest]) -> tuple[dict[int, int], list[int]]:
    """Chain the turns of each session in arrival order: (request index -> its session's next
    turn, the first turns in arrival order)."""
    next_turn: dict[int, int] = {}
    last_of: dict[int, int] = {}
    firsts: list[int] = []
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    for index in order:
        session = requests[index].session_id
        if session is not None and session in last_of:
            next_turn[last_of[session]] = index
        else:
            firsts.append(index)
        if session is not None:
            last_of[session] = index
    return next_turn, firsts
