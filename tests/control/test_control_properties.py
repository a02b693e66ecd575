"""Property tests of the reconciler: convergence, idempotence, gate, images, GC, labels."""

from __future__ import annotations

import math
import random
from dataclasses import replace

from control_support import FAILED, READY, endpoint, run, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.api import names
from warmfleet.api.resources import GatePolicy
from warmfleet.control.actions import Action, ApplyDeployment
from warmfleet.control.observed import NodeCacheReport, ObservedNode
from warmfleet.control.placement import choose_nodes, preferences
from warmfleet.control.reconciler import plan
from warmfleet.control.world import World

GATES = [
    GatePolicy(),
    GatePolicy(mode="minReady", min_ready_nodes=1),
    GatePolicy(mode="minReady", min_ready_percent=50.0),
    GatePolicy(mode="none"),
    GatePolicy(mode="all", timeout_s=60.0),
]


@st.composite
def fleets(draw: st.DrawFn) -> tuple[World, list[str], frozenset[str]]:
    node_count = draw(st.integers(1, 5))
    pools = draw(
        st.lists(st.sampled_from(["gpu", "cpu"]), min_size=node_count, max_size=node_count)
    )
    world = World(ObservedNode(f"n{i}", labels={"pool": p}) for i, p in enumerate(pools))
    count = draw(st.integers(1, 3))
    for i in range(count):
        s = spec(
            uri=draw(st.sampled_from(["s3://a", "s3://b"])),
            revision=draw(st.sampled_from(["v1", "v2"])),
            image=draw(st.sampled_from(["img:1", "img:2"])),
            weights=draw(st.booleans()),
            images=draw(st.booleans()),
            gate=draw(st.sampled_from(GATES)),
            replicas=draw(st.integers(0, 3)),
            selector=draw(st.sampled_from([{}, {"pool": "gpu"}])),
        )
        world.put_endpoint(endpoint(f"e{i}", s))
    failing = frozenset(
        draw(st.lists(st.sampled_from([f"n{i}" for i in range(node_count)]), max_size=2))
    )
    image_failures = draw(st.booleans())
    failing_all = failing | ({"images"} if image_failures else set())
    return world, [f"e{i}" for i in range(count)], frozenset(failing_all)


def _filler(failing: frozenset[str]) -> object:
    def fill(node: str, cache: str) -> NodeCacheReport:
        if cache.startswith("img-"):
            return FAILED if "images" in failing else READY
        return FAILED if node in failing else READY

    return fill


def _gate_open_independently(world: World, name: str, now_s: float) -> bool:
    e = world.endpoints[name]
    weights = e.spec.model_cache_config.weights_cache
    if not weights.enabled or weights.gate.mode == "none":
        return True
    cache = names.model_cache_name(name, e.spec)
    observed_cache = world.model_caches.get(cache)
    if observed_cache is None:
        return False
    targets = [n for n in world.nodes.values() if n.ready and n.matches(e.spec.node_selector)]
    ready = sum(1 for n in targets if (r := n.weights.get(cache)) is not None and r.usable)
    gate = weights.gate
    if gate.timeout_s is not None and now_s - observed_cache.created_s >= gate.timeout_s:
        return True
    if not targets:
        return False
    if gate.mode == "all":
        return ready == len(targets)
    if gate.min_ready_nodes is not None:
        return ready >= min(gate.min_ready_nodes, len(targets))
    return ready >= max(1, math.ceil(len(targets) * (gate.min_ready_percent or 100) / 100 - 1e-9))


def _check_gate(world: World, actions: list[Action], now_s: float) -> None:
    for a in actions:
        if not isinstance(a, ApplyDeployment):
            continue
        first_of_revision = not any(
            d.endpoint == a.plan.endpoint and d.revision == a.plan.revision
            for d in world.deployments.values()
        )
        if first_of_revision:
            assert _gate_open_independently(world, a.plan.endpoint, now_s), a


def _check_converged(world: World, now_s: float) -> None:
    for name, e in world.endpoints.items():
        rev = names.revision(e.spec)
        deps = [d for d in world.deployments.values() if d.endpoint == name]
        if _gate_open_independently(world, name, now_s):
            assert rev in {d.revision for d in deps}, "gate open (images irrelevant) => deployed"
        current = [d for d in deps if d.revision == rev]
        if any(d.revision != rev for d in deps):  # an old revision stays only while needed
            assert any(d.ready_replicas < d.replicas for d in current) or not current
        status = e.status
        assert status is not None
        pods = [p for d in deps if d.revision == rev for p in d.pods]
        share = sum(1 for p in pods if not p.prepared) / len(pods) if pods else 0.0
        assert math.isclose(status.unprepared_replica_share, share, abs_tol=1e-6)
    for node in world.nodes.values():
        if not node.ready:  # a lost node keeps no readiness label, whatever it last reported
            assert not any(names.is_managed_label(k) for k in node.labels)
            continue
        usable = {names.weights_label(c) for c, r in node.weights.items() if r.usable}
        usable |= {names.image_label(c) for c, r in node.images.items() if r.usable}
        managed = {k for k in node.labels if names.is_managed_label(k)}
        assert managed == usable, (node.name, managed, usable)


@settings(max_examples=60, deadline=None)
@given(fleets(), st.data())
def test_converges_and_collects(
    fleet: tuple[World, list[str], frozenset[str]], data: st.DataObject
) -> None:
    world, endpoint_names, failing = fleet
    fill = _filler(failing)

    def on_plan(w: World, actions: list[Action]) -> None:
        _check_gate(w, actions, now[0])
        now[0] += 10.0

    now = [0.0]
    end = run(world, fill=fill, on_plan=on_plan, rounds=40)  # type: ignore[arg-type]
    _check_converged(world, end)
    assert plan(world.desired(), world.observed(end)) == []

    # change a revision (rollover) and converge again
    target = data.draw(st.sampled_from(endpoint_names))
    old = world.endpoints[target]
    world.put_endpoint(
        endpoint(
            target,
            old.spec.model_copy(
                update={"model_source": old.spec.model_source.model_copy(update={"revision": "v9"})}
            ),
        )
    )
    now[0] = end
    end = run(world, start_s=end, fill=fill, on_plan=on_plan, rounds=40)  # type: ignore[arg-type]
    _check_converged(world, end)

    # delete everything: all data, labels, caches and deployments are gone
    for name in endpoint_names:
        world.delete_endpoint(name)
    run(world, start_s=end, fill=fill, rounds=40)  # type: ignore[arg-type]
    assert not world.endpoints
    assert not world.deployments
    assert not world.model_caches
    assert not world.image_caches
    for node in world.nodes.values():
        assert not node.assigned
        assert not node.weights
        assert not node.images
        assert not any(names.is_managed_label(k) for k in node.labels)


@settings(max_examples=40, deadline=None)
@given(fleets())
def test_plan_is_deterministic_and_replay_is_harmless(
    fleet: tuple[World, list[str], frozenset[str]],
) -> None:
    world, _, failing = fleet
    fill = _filler(failing)
    for step in range(4):
        now = step * 10.0
        actions = plan(world.desired(), world.observed(now))
        assert actions == plan(world.desired(), world.observed(now))
        world.apply(actions, now)
        once = world.observed(now)
        world.apply(actions, now)
        assert world.observed(now) == once
        world.agents_step(fill)  # type: ignore[arg-type]
        world.schedule(now)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(["cold", "image", "weights", "both"]), min_size=1, max_size=8),
    st.integers(1, 10),
)
def test_placement_prefers_warm_nodes(kinds: list[str], count: int) -> None:
    prefs = preferences("c", "i")
    wl, il = names.weights_label("c"), names.image_label("i")
    label_sets = {
        "cold": {},
        "image": {il: "ready"},
        "weights": {wl: "ready"},
        "both": {wl: "ready", il: "ready"},
    }
    nodes = [ObservedNode(f"n{i}", labels=label_sets[k]) for i, k in enumerate(kinds)]
    chosen = choose_nodes(count, nodes, prefs, {})
    assert len(chosen) == min(count, len(nodes))
    rank = {"both": 3, "weights": 2, "image": 1, "cold": 0}
    picked = sorted((rank[kinds[int(p.node[1:])]] for p in chosen), reverse=True)
    assert picked == sorted((rank[k] for k in kinds), reverse=True)[: len(chosen)]
    for p in chosen:
        assert p.prepared == (kinds[int(p.node[1:])] in {"weights", "both"})


@settings(max_examples=40, deadline=None)
@given(fleets(), st.data())
def test_node_churn_reconverges(
    fleet: tuple[World, list[str], frozenset[str]], data: st.DataObject
) -> None:
    world, _, failing = fleet
    fill = _filler(failing)
    end = run(world, fill=fill, rounds=40)  # type: ignore[arg-type]
    lost = data.draw(st.sampled_from(sorted(world.nodes)))
    world.nodes[lost] = replace(world.nodes[lost], ready=False)
    world.nodes["fresh"] = ObservedNode("fresh", labels={"pool": "gpu"})
    end = run(world, start_s=end, fill=fill, rounds=40)  # type: ignore[arg-type]
    _check_converged(world, end)
    assert not any(names.is_managed_label(k) for k in world.nodes[lost].labels)
    assert all(p.node != lost for d in world.deployments.values() for p in d.pods)
    fresh = world.nodes["fresh"]
    for name, cache in world.model_caches.items():
        if fresh.matches(cache.spec.node_selector):
            assert name in fresh.assigned  # a new node is warmed with every wanted cache


@settings(max_examples=40, deadline=None)
@given(fleets(), st.randoms(use_true_random=False))
def test_plan_does_not_depend_on_the_order_things_were_listed_in(
    fleet: tuple[World, list[str], frozenset[str]], rnd: random.Random
) -> None:
    world, names_, failing = fleet
    fill = _filler(failing)
    for step in range(5):
        now = step * 10.0
        if step == 3:  # a rollover and a deletion in flight: old and new objects side by side
            old = world.endpoints[names_[0]]
            source = old.spec.model_source.model_copy(update={"revision": "v9"})
            world.put_endpoint(
                endpoint(names_[0], old.spec.model_copy(update={"model_source": source}))
            )
            world.delete_endpoint(names_[-1])
        observed = world.observed(now)
        shuffled = replace(
            observed,
            nodes=tuple(rnd.sample(observed.nodes, len(observed.nodes))),
            model_caches=tuple(rnd.sample(observed.model_caches, len(observed.model_caches))),
            image_caches=tuple(rnd.sample(observed.image_caches, len(observed.image_caches))),
            deployments=tuple(rnd.sample(observed.deployments, len(observed.deployments))),
        )
        desired = world.desired()
        actions = plan(desired, observed)
        assert plan(rnd.sample(desired, len(desired)), shuffled) == actions
        world.apply(actions, now)
        world.agents_step(fill)  # type: ignore[arg-type]
        world.schedule(now)
        world.mark_ready(now)
