"""Active health checking: poll every instance's health path once per ``interval_s``.

A round probes all instances concurrently, on a pool of their own, at most
``gateway.probes.READ_SLOTS["health"]`` at once (as many as the session's pool holds);
rounds start ``interval_s`` apart. A probe's ``timeout_s`` starts once it has its slot
(``gateway.probes.Prober``): it covers the probe's own exchange only, so a round in which many
wedged instances hold every slot for their timeout delays the other probes but never fails
them (waiting for a slot is not the instance's failure). An instance is ejected after
``unhealthy_threshold`` consecutive failed probes (with the default of 2, within two intervals
of dying) and readmitted after ``healthy_threshold`` consecutive successes. Settings are re-read
every round, so a reload applies at the next round.

A probe never ends a *passive* ejection (``gateway.outlier``: an instance whose completions
hang may answer its health path all along); only real requests do, on probation. Each round
moves the passive ejections whose time has passed to probation (requests do that too), so
the admin view and the gauges stay current without traffic. It also forgets the metric series
of the instances that left once their last request ended (``gateway.departures``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import ClientError, ClientSession

from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.probes import Prober
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.gateway.world import GatewayState

log = logging.getLogger(__name__)


class HealthMonitor:
    """Owned by the app lifespan; ``run`` is cancelled on shutdown."""

    def __init__(self, state: GatewayState, session: ClientSession) -> None:
        self.state = state
        self.session = session
        self._prober = Prober(session)
        self.rounds_completed = 0
        self._round_done = asyncio.Event()

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            await self.poll_once()
            interval = self.state.health.interval_s
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def poll_once(self) -> None:
        """Probe every instance of every variant once and apply the thresholds."""
        probes = [
            self._probe(variant, inst)
            for variant in self.state.variants()
            for inst in variant.instances.values()
        ]
        if probes:
            await asyncio.gather(*probes)
        for variant in self.state.variants():
            variant.expire_ejections()
        self.state.forget_departed()  # the series of departed instances whose requests ended
        self.rounds_completed += 1
        self._round_done.set()
        self._round_done = asyncio.Event()

    async def wait_round(self) -> int:
        """Wait for the next round to complete; returns ``rounds_completed``."""
        await self._round_done.wait()
        return self.rounds_completed

    async def _probe(self, variant: VariantRuntime, inst: InstanceRuntime) -> None:
        health = self.state.health
        ok = await self.check(inst.base_url + health.path, health.timeout_s)
        if inst.removed:
            return
        if ok:
            variant.record_success(inst, health.healthy_threshold)
        else:
            variant.record_failure(inst, health.unhealthy_threshold, "active")

    async def check(self, url: str, timeout_s: float) -> bool:
        """Whether ``url`` answers 200 within ``timeout_s``, counted from when the probe has its
        slot (the wait for one is not the instance's time)."""
        try:
            async with self._prober.get(url, timeout_s) as resp:
                await resp.read()
                return resp.status == 200
        except (ClientError, TimeoutError, OSError) as err:
            log.debug("health probe %s failed: %r", url, err)
            return False
