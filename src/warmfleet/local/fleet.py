"""``EmbeddedFleet``: the reconciler loop of the one-machine backend.

Each pass: observe (agents' ``/v1/fleet/caches``, engine processes, the gateway's gauges),
autoscale, ``plan(desired, observed)``, apply the actions to ``control.world.World`` (the reference
semantics of every action), then do them for real: push cache assignments to the agents, start
engines on ``choose_nodes`` placements (warm nodes first, else from the origin), drain, park or
stop replicas, rewrite the gateway's instance files, write ``state.json`` (``warmfleet status``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import aiohttp

from warmfleet.control.actions import Action, AssignNodeCaches, NodeCacheAssignment
from warmfleet.control.autoscaler import AutoscalerState
from warmfleet.control.load import VariantKey, autoscale, in_flight_by_variant
from warmfleet.control.observed import DesiredEndpoint, ObservedNode
from warmfleet.control.placement import choose_nodes
from warmfleet.control.reconciler import plan
from warmfleet.control.world import World
from warmfleet.gateway.server import StartedApp
from warmfleet.local import infra
from warmfleet.local import standby as standby_
from warmfleet.local.backoff import CrashBackoff
from warmfleet.local.config import EndpointEntry, LocalFleet, model_location
from warmfleet.local.events import FleetWatcher, action_event
from warmfleet.local.procs import Child, stop_all
from warmfleet.local.replicas import (
    Replica,
    drained,
    start_replica,
    start_timed_out,
    write_instance_files,
)
from warmfleet.local.state import (
    MAX_EVENTS,
    MAX_HISTORY,
    in_flight_by_instance,
    lock_workdir,
    snapshot,
    trim_history,
    write_state,
)
from warmfleet.local.tracker_host import TrackerHost


class EmbeddedFleet:
    """``watcher`` is told every event and every node's cache reports as they come."""

    def __init__(self, config: LocalFleet, watcher: FleetWatcher | None = None) -> None:
        self.spec = config.spec
        self.watcher = watcher
        self.workdir = Path(self.spec.workdir).resolve()
        nodes = [ObservedNode(n.name, labels=dict(n.labels)) for n in self.spec.nodes]
        self.world = World(nodes)
        self.t0_wall_s = time.time()
        self.agents: dict[str, Child] = {}
        self.agent_token = secrets.token_urlsafe(32)  # this run's, given to its agents
        self.agent_urls: dict[str, str] = {}
        self.tracker = TrackerHost(self.spec.peers, self.agent_token)  # peers: pieces' sources
        self.agent_down_since: dict[str, float] = {}
        self.cache_paths: dict[tuple[str, str], str] = {}
        self.assignments: dict[str, tuple[NodeCacheAssignment, ...]] = {}
        self.replicas: dict[str, Replica] = {}
        self.history: dict[str, dict[str, Any]] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self.backoff = CrashBackoff(
            self.spec.engine.crash_backoff_s, self.spec.engine.crash_backoff_max_s
        )
        self.origin: Child | None = None
        self.origin_url = ""
        self.gateway: StartedApp | None = None
        self.in_flight: dict[str, float] = {}
        self._metrics_text: str | None = None  # the gateway's /metrics at the latest pass
        self.scaling: dict[VariantKey, AutoscalerState] = {}
        self.passes = 0
        self.last_pass_s = 0.0
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self.standbys = standby_.Standbys(
            self.event, self._drain, self._write_gateway_files, lambda r: self.in_flight.get(r, 0.0)
        )
        self._counter = 0
        self._session: aiohttp.ClientSession | None = None
        self._lock: IO[str] | None = None  # the workdir's, while this fleet runs

    # ------------------------------------------------------------------ lifecycle

    def now_s(self) -> float:
        return time.time() - self.t0_wall_s

    def event(self, kind: str, **fields: Any) -> None:
        self.events.append({"t": round(self.now_s(), 3), "kind": kind, **fields})
        if self.watcher is not None:
            self.watcher.event(self.events[-1])

    async def __aenter__(self) -> EmbeddedFleet:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._lock = lock_workdir(self.workdir)  # another fleet there: FleetProcessError
        self._session, token = aiohttp.ClientSession(), self.agent_token
        self.origin, self.origin_url = await infra.start_origin(self.spec, self.workdir)
        await self.tracker.start()
        for n in self.spec.nodes:
            self.agents[n.name] = await infra.start_agent(n.name, n.budget, self.workdir, token)
        self.gateway = await infra.start_gateway(self.spec, self.workdir)
        for entry in self.spec.endpoints:
            self.put_endpoint(entry.name, entry.spec)
        self.event("fleet_started", gateway=self.gateway.url, origin=self.origin_url)

    async def stop(self) -> None:
        """Stop every process this fleet started, by PID (engines, agents, origin)."""
        if self._lock is None:  # the workdir is not ours (nothing was started, or stopped)
            return
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None
        children = [r.child for r in self.replicas.values()] + list(self.agents.values())
        if self.origin is not None:
            children.append(self.origin)
        await self.standbys.stop()
        await stop_all(children)
        await self.tracker.stop()
        await asyncio.gather(*self._stopping.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        with contextlib.suppress(OSError):
            write_state(self.workdir, snapshot(self, running=False))
        self._lock.close()
        self._lock = None

    def put_endpoint(self, name: str, spec: Any) -> None:
        old = self.world.endpoints.get(name)
        scaled = old.autoscaled_replicas if old else {}
        self.world.put_endpoint(DesiredEndpoint(name, spec, uid=name, autoscaled_replicas=scaled))

    def apply_endpoints(self, entries: Sequence[EndpointEntry]) -> None:
        """The fleet file's endpoints after an edit: put every listed one, delete the others
        (a deleted endpoint is garbage-collected by the reconciler, then released)."""
        listed = {entry.name for entry in entries}
        for entry in entries:
            self.put_endpoint(entry.name, entry.spec)
        for name, endpoint in list(self.world.endpoints.items()):
            if name not in listed and not endpoint.deleting:
                self.world.delete_endpoint(name)
                self.event("endpoint_deleted", endpoint=name)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.reconcile_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.spec.reconcile_interval_s)

    # ------------------------------------------------------------------ one pass

    async def reconcile_once(self) -> list[Action]:
        started = time.monotonic()
        await self._observe_agents()
        await self._observe_gateway()
        self._observe_replicas()
        now = self.now_s()
        self._autoscale(now)
        actions = plan(self.world.desired(), self.world.observed(now))
        self.world.apply(actions, now)
        self._record(actions)
        await self._push_assignments()
        await self._sync_replicas()
        self._write_gateway_files()
        await self._reap()
        self.passes += 1
        self.last_pass_s = time.monotonic() - started
        write_state(self.workdir, snapshot(self, running=True))
        return actions

    def _write_gateway_files(self) -> None:
        endpoints, replicas = self.world.endpoints.values(), self.replicas.values()
        for endpoint, variant, ids in write_instance_files(self.workdir, endpoints, replicas):
            self.event("gateway_switched", endpoint=endpoint, variant=variant, instances=ids)

    async def _observe_agents(self) -> None:
        for name, child in list(self.agents.items()):
            reports: dict[str, Any] = {}
            if not child.alive:
                down = self.agent_down_since.setdefault(name, time.time())
                if name in self.agent_urls:
                    self.agent_urls.pop(name)
                    self.event("agent_down", node=name, pid=child.pid)
                if time.time() - down >= self.spec.agent_restart_delay_s:
                    budget = next(n.budget for n in self.spec.nodes if n.name == name)
                    self.agents[name] = await infra.start_agent(
                        name, budget, self.workdir, self.agent_token
                    )
                    self.agent_down_since.pop(name, None)
                    self.event("agent_restarted", node=name, pid=self.agents[name].pid)
            elif child.poll_ready() and child.ready_info is not None:
                self.agent_urls[name] = str(child.ready_info["url"])
                reports = await self._agent_reports(name)
                if self.watcher is not None:
                    self.watcher.caches(name, reports)
            node = self.world.nodes[name]
            self.world.nodes[name] = replace(node, weights=reports)

    async def _agent_reports(self, name: str) -> dict[str, Any]:
        assert self._session is not None
        try:
            doc = await infra.get_json(self._session, self.agent_urls[name] + "/v1/fleet/caches")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return {}
        reports, paths = infra.parse_reports(doc)
        for key in [k for k in self.cache_paths if k[0] == name]:
            del self.cache_paths[key]
        self.cache_paths.update({(name, cache): path for cache, path in paths.items()})
        return reports

    async def _observe_gateway(self) -> None:
        if self.gateway is None or self._session is None:
            return
        # A failed scrape is no sample: the autoscaler holds its counts rather than act on the
        # last good one again; drains keep the last known in-flight counts.
        self._metrics_text = None
        text = await infra.scrape_metrics(self._session, self.gateway.url)
        if text is not None:
            with contextlib.suppress(ValueError):
                self.in_flight = in_flight_by_instance(text)
                self._metrics_text = text

    def _observe_replicas(self) -> None:
        for replica in list(self.replicas.values()):
            info = self.history[replica.name]
            if replica.ready and info.get("timeToReadyS") is None:
                info.update(replica.summary())
                self.backoff.ready(replica.deployment)
                self.event("replica_ready", replica=replica.name, node=replica.node)
            if not replica.child.alive and replica.draining_since_s is None:
                replica.failed = True
                del self.replicas[replica.name]
                info["state"] = "exited"
                wait_s = self.backoff.exited(replica.deployment, time.time())
                rc = replica.child.proc.returncode
                self.event("replica_exited", replica=replica.name, rc=rc, backoff_s=wait_s)
            elif start_timed_out(replica, self.spec.engine.start_timeout_s):  # replaced below
                self._drain(replica)
                info["state"] = "startTimedOut"
                self.event("replica_start_timeout", replica=replica.name, node=replica.node)
        for name, dep in list(self.world.deployments.items()):
            pods = tuple(
                r.observed(self.t0_wall_s)
                for r in self.replicas.values()
                if r.deployment == name and r.draining_since_s is None and not r.parked
            )
            self.world.deployments[name] = replace(dep, pods=pods)

    def _autoscale(self, now: float) -> None:
        text = self._metrics_text
        if text is None:
            return
        endpoints = self.world.desired()
        deployments = list(self.world.deployments.values())
        in_flight = in_flight_by_variant([text])
        decisions, self.scaling = autoscale(endpoints, deployments, in_flight, now, self.scaling)
        for name, by_variant in decisions.items():
            endpoint = self.world.endpoints[name]
            if dict(endpoint.autoscaled_replicas) != by_variant:
                self.world.endpoints[name] = replace(endpoint, autoscaled_replicas=by_variant)
                self.event("autoscaled", endpoint=name, replicas=by_variant)

    # ------------------------------------------------------------------ executing actions

    def _record(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, AssignNodeCaches):
                self.assignments[action.node] = action.caches
            if (recorded := action_event(action)) is not None:
                self.event(recorded[0], **recorded[1])

    async def _push_assignments(self) -> None:
        assert self._session is not None
        for node, caches in self.assignments.items():
            url = self.agent_urls.get(node)
            if url is None:
                continue
            body: dict[str, Any] = {
                "caches": [{"cache": c.cache, "uri": self._origin_url(c.source)} for c in caches]
            }
            body.update(self.tracker.assignment_extra(node, url))
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await infra.put_assignments(self._session, url, body, self.agent_token)

    async def _sync_replicas(self) -> None:
        for name in sorted(self.world.deployments):
            await self._sync_deployment(name, self.world.deployments[name].replicas)
        self.backoff.retain(self.world.deployments)
        for replica in self.replicas.values():
            if replica.deployment not in self.world.deployments:
                self._drain(replica)

    async def _sync_deployment(self, name: str, desired: int) -> None:
        """Drain (or park as a standby) extra replicas; wake a standby before placing new ones."""
        mine = [
            r for r in self.replicas.values() if r.deployment == name and r.draining_since_s is None
        ]
        active = [r for r in mine if r.standby is None]
        serving = len(active) + sum(1 for r in mine if r.standby == standby_.WAKING)
        parked = [r for r in mine if r.standby in (standby_.PARKING, standby_.ASLEEP)]
        spec = standby_.standby_spec(self.world, name)
        for extra in sorted(active, key=lambda r: (r.ready, r.name))[: max(serving - desired, 0)]:
            if extra.ready and standby_.wants_standby(spec, desired, len(parked)) and self._session:
                parked.append(extra)
                self.standbys.park(self._session, extra, spec.sleep_level, self.spec.drain_grace_s)
            else:
                self._drain(extra)
        missing = desired - serving
        for sleeping in [r for r in parked if r.standby == standby_.ASLEEP][: max(missing, 0)]:
            missing -= 1
            if self._session is not None:  # started (always, but for the unit tests)
                self.standbys.wake(self._session, sleeping)
        if missing > 0 and self.backoff.wait_s(name, time.time()) <= 0:
            await self._place(name, missing)

    async def _place(self, deployment: str, count: int) -> None:
        plan_ = self.world.plans[deployment].plan
        load: dict[str, int] = {}
        for r in self.replicas.values():
            load[r.node] = load.get(r.node, 0) + 1
        placements = choose_nodes(
            count,
            list(self.world.nodes.values()),
            plan_.preferences,
            load,
            node_selector=plan_.node_selector,
            max_per_node=self.spec.engine.replicas_per_node,
        )
        for placement in placements:
            path = self.cache_paths.get((placement.node, plan_.model_cache or ""))
            prepared = placement.prepared and path is not None and plan_.model_cache is not None
            source = path if prepared and path else self._origin_url(plan_.model_source)
            self._counter += 1
            name = f"{deployment}-{self._counter}"
            engine, model = self.spec.engine, plan_.endpoint
            child = await start_replica(name, source, engine, model, self.workdir)
            replica = Replica(
                name,
                deployment,
                plan_.endpoint,
                plan_.variant,
                placement.node,
                prepared,
                source,
                child,
            )
            self.replicas[name] = replica
            self.history[name] = {**replica.summary(), "revision": plan_.revision}
            trim_history(self.history, {*self.replicas, *self._stopping}, MAX_HISTORY)
            self.event("replica_started", replica=name, node=placement.node, prepared=prepared)

    def _origin_url(self, source: Any) -> str:
        return model_location(self.spec, self.origin_url, source.uri, source.revision)

    def _drain(self, replica: Replica) -> None:
        if replica.draining_since_s is None:
            replica.draining_since_s = time.time()
            self.event("replica_draining", replica=replica.name)

    async def _reap(self) -> None:
        """Stop drained replicas in the background (a slow exit never stalls the loop)."""
        for replica in list(self.replicas.values()):
            if drained(replica, self.in_flight, self.spec.drain_grace_s):
                del self.replicas[replica.name]
                task = asyncio.create_task(self._stop_replica(replica))
                self._stopping[replica.name] = task

    async def _stop_replica(self, replica: Replica) -> None:
        try:
            await replica.child.stop()
        finally:
            self._stopping.pop(replica.name, None)
            if (info := self.history.get(replica.name)) is not None:
                info["state"] = "stopped"
            self.event("replica_stopped", replica=replica.name, pid=replica.child.pid)
