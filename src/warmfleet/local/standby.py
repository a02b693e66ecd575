"""Warm standby of the embedded fleet (``standby.engine: asleep``): an engine kept asleep.

When a variant with a standby engine scales to zero, its last replica is not stopped: it leaves
the gateway's instance file, finishes what it serves, and is put to sleep (vLLM's
``POST /sleep?level=N``) on its node. When the variant scales up again, the sleeping replica is
woken (``POST /wake_up``) before any new one is placed, and rejoins the instance file as soon
as it answers: the first request after idle pays the wake, not a process start and a weights
load. A standby whose sleep or wake fails is stopped (the reconciler then places a new one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from warmfleet.api.resources import StandbySpec
from warmfleet.control.world import World
from warmfleet.local.replicas import Replica

PARKING, ASLEEP, WAKING = "parking", "asleep", "waking"
SLEEP_TIMEOUT_S = 90.0  # the engine drains its running requests first
WAKE_TIMEOUT_S = 120.0  # a level-2 wake reads the weights again
_POLL_S = 0.05


def standby_spec(world: World, deployment: str) -> StandbySpec:
    """The standby settings of the variant a Deployment belongs to."""
    plan = world.plans[deployment].plan
    endpoint = world.endpoints.get(plan.endpoint)
    variants = endpoint.spec.variants if endpoint else ()
    return next((v.standby for v in variants if v.name == plan.variant), StandbySpec())


def wants_standby(standby: StandbySpec, desired: int, parked: int) -> bool:
    """Park (rather than stop) a replica the variant no longer needs: at zero, with a standby
    engine configured, and none parked yet."""
    return standby.engine == "asleep" and desired == 0 and parked == 0


async def _post(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    try:
        async with session.post(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def park(
    session: aiohttp.ClientSession,
    replica: Replica,
    level: int,
    in_flight: Callable[[], float],
    grace_s: float,
) -> bool:
    """Put ``replica`` (already out of the instance file) to sleep once the gateway has nothing
    in flight on it; True when it sleeps."""
    replica.standby = PARKING
    deadline_s = time.monotonic() + SLEEP_TIMEOUT_S
    await asyncio.sleep(grace_s)  # the gateway's discovery drops it first
    while in_flight() > 0 and time.monotonic() < deadline_s:
        await asyncio.sleep(_POLL_S)
    if replica.url is None or not await _post(
        session, f"{replica.url}/sleep?level={level}", SLEEP_TIMEOUT_S
    ):
        return False
    replica.standby = ASLEEP
    return True


async def wake(session: aiohttp.ClientSession, replica: Replica) -> bool:
    """Wake a sleeping standby; True when it serves again (``standby`` cleared)."""
    replica.standby = WAKING
    if replica.url is None or not await _post(session, f"{replica.url}/wake_up", WAKE_TIMEOUT_S):
        return False
    replica.standby = None
    return True


class Standbys:
    """The parking and waking tasks of one fleet. ``event`` records a fleet event, ``drain``
    stops a replica whose standby failed, ``serve_now`` rewrites the gateway's instance files,
    ``in_flight`` is the gateway's in-flight count of a replica."""

    def __init__(
        self,
        event: Callable[..., None],
        drain: Callable[[Replica], None],
        serve_now: Callable[[], None],
        in_flight: Callable[[str], float],
    ) -> None:
        self._event, self._drain, self._serve_now = event, drain, serve_now
        self._in_flight = in_flight
        self.tasks: set[asyncio.Task[None]] = set()

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def park(
        self, session: aiohttp.ClientSession, replica: Replica, level: int, grace_s: float
    ) -> None:
        replica.standby = PARKING
        self._background(self._park(session, replica, level, grace_s))

    def wake(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        replica.standby = WAKING
        self._background(self._wake(session, replica))

    async def _park(
        self, session: aiohttp.ClientSession, replica: Replica, level: int, grace_s: float
    ) -> None:
        self._event("standby_parking", replica=replica.name, node=replica.node, level=level)

        def in_flight() -> float:
            return self._in_flight(replica.name)

        if await park(session, replica, level, in_flight, grace_s):
            self._event("standby_asleep", replica=replica.name, node=replica.node)
        else:
            replica.standby = None
            self._drain(replica)

    async def _wake(self, session: aiohttp.ClientSession, replica: Replica) -> None:
        started = time.monotonic()
        if await wake(session, replica):
            wake_s = round(time.monotonic() - started, 4)
            self._event("standby_woken", replica=replica.name, node=replica.node, wake_s=wake_s)
            self._serve_now()  # serve now, not at the next pass
        else:
            replica.standby = None
            self._drain(replica)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
