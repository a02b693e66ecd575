"""The gateway's adapter of the zero-ready hold (``routing.hold.ZeroReadyHold``).

``spec.hold`` (off unless given): a request for a variant with no routable instance waits, up to
``maxHeldPerVariant`` per variant and ``timeoutS`` each, for one to become routable (the variant
calls ``on_routable`` when its routable set changes and is not empty), then is routed as usual;
else it is answered 503 in the OpenAI error envelope with ``Retry-After: retryAfterS`` (reason
``hold_timeout`` or ``hold_full``). The check on the request path is one attribute read
(``variant.routable`` empty), so a variant with instances never pays for the hold.

Metrics (read by the autoscaler as demand: ``control.load``): ``warmfleet_gateway_held_requests
{endpoint,variant}`` (a sample for every variant, 0 when none is held) and
``warmfleet_gateway_hold_outcomes_total{endpoint,variant,outcome}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from warmfleet.core.errors import NoInstanceAvailableError
from warmfleet.gateway.errors import error_response
from warmfleet.gateway.hold_config import HoldConfig
from warmfleet.gateway.http.messages import Response
from warmfleet.routing.hold import HoldOutcome, Waiter, ZeroReadyHold

if TYPE_CHECKING:
    from warmfleet.gateway.variant import VariantRuntime
    from warmfleet.gateway.world import GatewayState


class GatewayHold:
    """Parks a future per held request; released by the variant's ``on_routable``."""

    def __init__(
        self, state: GatewayState, registry: CollectorRegistry, clock: Callable[[], float]
    ) -> None:
        self.state = state
        self.queue = ZeroReadyHold(1, 1.0, clock)  # limits from spec.hold at each admission
        self._futures: dict[Waiter, asyncio.Future[None]] = {}
        registry.register(_HoldCollector(self))
        state.series_owners.append(self)  # told when a removed variant's series go

    def active(self) -> bool:
        return self.state.spec.hold is not None

    async def wait(self, variant: VariantRuntime) -> Response | None:
        """Hold a request for ``variant`` (which has no routable instance): None once one is
        routable (route it), else the 503 to send."""
        config = self.state.spec.hold
        if config is None:
            return None
        queue = self.queue
        queue.max_held, queue.timeout_s = config.max_held_per_variant, config.timeout_s
        waiter = queue.admit((variant.endpoint, variant.name))
        if waiter is None:
            held = config.max_held_per_variant
            return _shed(variant, config, "hold_full", f"{held} requests are held already")
        if variant.on_routable is None:  # gateway.flow's hook calls ``release`` too
            variant.on_routable = self.release
        future = asyncio.get_running_loop().create_future()
        self._futures[waiter] = future
        try:
            async with asyncio.timeout(config.timeout_s):
                await future
            return None
        except TimeoutError:
            queue.leave(waiter, HoldOutcome.TIMEOUT)
            return _shed(variant, config, "hold_timeout", f"none within {config.timeout_s:g} s")
        except asyncio.CancelledError:
            queue.leave(waiter, HoldOutcome.CANCELLED)
            raise
        finally:
            self._futures.pop(waiter, None)

    def waiting(self, endpoint: str, variant: str) -> bool:
        """Whether a request for that variant is held."""
        return self.queue.held((endpoint, variant)) > 0

    def forget_variant(self, endpoint: str, variant: str) -> None:
        """That variant is gone and none of its requests is held: its outcomes go."""
        self.queue.forget((endpoint, variant))

    def release(self, variant: VariantRuntime) -> None:
        """``variant`` has a routable instance: its held requests go on."""
        for waiter in self.queue.release((variant.endpoint, variant.name)):
            future = self._futures.get(waiter)
            if future is not None and not future.done():
                future.set_result(None)


def _shed(variant: VariantRuntime, config: HoldConfig, reason: str, why: str) -> Response:
    err = NoInstanceAvailableError(
        f"no ready instance in variant {variant.name!r} of endpoint {variant.endpoint!r} "
        f"({why}); retry after {config.retry_after_s} s"
    )
    variant.request_counter("none", reason, "503").inc()
    headers = {"Retry-After": str(config.retry_after_s)}
    return error_response(err, reason=reason, extra_headers=headers)


class _HoldCollector:
    """The hold's gauge and counters, read from the pure object at scrape time."""

    def __init__(self, hold: GatewayHold) -> None:
        self.hold = hold

    def collect(self) -> Iterator[Metric]:
        queue = self.hold.queue
        held = GaugeMetricFamily(
            "warmfleet_gateway_held_requests",
            "Requests held for a variant with no ready instance (scale-from-zero demand)",
            labels=("endpoint", "variant"),
        )
        for variant in self.hold.state.variants():
            key = (variant.endpoint, variant.name)
            held.add_metric(list(key), queue.held(key))
        outcomes = CounterMetricFamily(
            "warmfleet_gateway_hold_outcomes",
            "Ended holds by outcome (served, timeout, full, cancelled)",
            labels=("endpoint", "variant", "outcome"),
        )
        for (variant_key, outcome), count in sorted(queue.outcomes.items(), key=str):
            endpoint, name = variant_key if isinstance(variant_key, tuple) else ("", variant_key)
            outcomes.add_metric([str(endpoint), str(name), outcome.value], count)
        yield held
        yield outcomes

    def describe(self) -> Iterator[Metric]:
        return iter(())
