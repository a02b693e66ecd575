"""Builders and a driver loop for reconciler tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from warmfleet.api.resources import (
    GatePolicy,
    ImageCacheConfig,
    InferenceEndpointSpec,
    ModelCacheConfig,
    ModelSource,
    ProductionVariant,
    WeightsCacheConfig,
)
from warmfleet.control.actions import Action
from warmfleet.control.observed import (
    DesiredEndpoint,
    NodeCacheReport,
    NodeCacheState,
    ObservedNode,
)
from warmfleet.control.reconciler import plan
from warmfleet.control.world import FillOutcome, World

READY = NodeCacheReport(NodeCacheState.READY, 10, 10)
FAILED = NodeCacheReport(NodeCacheState.FAILED, 3, 10, message="origin 503")
DOWNLOADING = NodeCacheReport(NodeCacheState.DOWNLOADING, 5, 10)


def spec(
    uri: str = "s3://models/llama",
    revision: str = "v1",
    image: str = "vllm/vllm-openai:v0.9",
    *,
    weights: bool = True,
    images: bool = True,
    gate: GatePolicy | None = None,
    replicas: int = 2,
    selector: dict[str, str] | None = None,
) -> InferenceEndpointSpec:
    return InferenceEndpointSpec(
        model_source=ModelSource(uri=uri, revision=revision),
        image=image,
        node_selector=selector or {},
        model_cache_config=ModelCacheConfig(
            weights_cache=WeightsCacheConfig(enabled=weights, gate=gate or GatePolicy()),
            image_cache=ImageCacheConfig(enabled=images),
        ),
        variants=(ProductionVariant(name="main", replicas=replicas),),
    )


def endpoint(name: str, s: InferenceEndpointSpec | None = None) -> DesiredEndpoint:
    return DesiredEndpoint(name=name, spec=s or spec(), uid=f"uid-{name}")


def nodes(count: int, labels: dict[str, str] | None = None) -> list[ObservedNode]:
    return [ObservedNode(f"n{i}", labels=dict(labels or {"pool": "gpu"})) for i in range(count)]


@dataclass
class Trace:
    """Every plan the driver executed, with the time it was executed at."""

    steps: list[tuple[float, list[Action]]] = field(default_factory=list)

    def all(self) -> list[tuple[float, Action]]:
        return [(t, a) for t, actions in self.steps for a in actions]


def run(
    world: World,
    *,
    start_s: float = 0.0,
    rounds: int = 30,
    fill: FillOutcome | None = None,
    on_plan: Callable[[World, list[Action]], None] | None = None,
    trace: Trace | None = None,
    step_s: float = 10.0,
) -> float:
    """Plan/apply/agents/schedule/ready until the plan is empty; returns the end time.

    Raises AssertionError if it does not converge within ``rounds``.
    """
    now = start_s
    for _ in range(rounds):
        # the outside world moves first (agents, scheduler, kubelet), then the controller looks
        if fill is None:
            world.agents_step()
        else:
            world.agents_step(fill)
        world.schedule(now)
        world.mark_ready(now)
        actions = plan(world.desired(), world.observed(now))
        if on_plan is not None:
            on_plan(world, actions)
        if trace is not None:
            trace.steps.append((now, actions))
        if not actions:
            return now
        world.apply(actions, now)
        now += step_s
    raise AssertionError(f"no convergence in {rounds} rounds; last plan: {actions}")
