"""The gateways' ``/metrics`` for autoscaling: fixed URLs, and every ready pod of a Service.

A Service URL reaches one gateway replica per request, so with several replicas it shows a
fraction of the in-flight requests. ``--gateway-service namespace/name[:port]`` instead lists
the Service's EndpointSlices at every scrape (the same rules as the gateway's own engine
discovery: ready endpoints, the port by name or number) and scrapes each pod. A gateway that
cannot be read, or a listing that fails, gives ``None``: the autoscaler then treats the sum as
a lower bound (``control.load.autoscale(partial=True)``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

from warmfleet.kube import client as kube
from warmfleet.kube.endpointslices import belongs_to, endpoints_from_slices

log = logging.getLogger(__name__)


def _metrics_url(_pod: str, url: str) -> str:
    """A gateway pod's metrics URL (``ValueError`` if its address makes no URL)."""
    return str(URL(url) / "metrics")


Scrape = Callable[[], Awaitable[list[str | None]]]


@dataclass(frozen=True)
class GatewayService:
    namespace: str
    name: str
    port: str | int = "http"

    @classmethod
    def parse(cls, text: str) -> GatewayService:
        """``namespace/name[:port]`` (port: a Service port name or number; default ``http``)."""
        ref, colon, port = text.partition(":")
        namespace, _, name = ref.partition("/")
        if not namespace or not name or "/" in name or (colon and not port):
            raise ValueError(f"gateway service {text!r}: expected namespace/name[:port]")
        return cls(namespace, name, int(port) if port.isdigit() else port or "http")


def scraper(
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    services: Sequence[GatewayService] = (),
    client: kube.KubeClient | None = None,
    timeout_s: float = 3.0,
) -> Scrape:
    """Every fixed URL, then every ready pod of every Service (``client`` lists the slices)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def fetch(url: str) -> str | None:
        try:
            async with session.get(url, timeout=timeout) as resp:
                resp.raise_for_status()
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as err:
            log.warning("gateway metrics %s unavailable: %s", url, err)
            return None

    async def pods(service: GatewayService) -> list[str] | None:
        assert client is not None
        try:
            slices = await client.list(await client.endpoint_slices(), service.namespace)
        except (kube.KubeError, aiohttp.ClientError, TimeoutError, ValueError) as err:
            log.warning(
                "gateway service %s/%s not listed: %s", service.namespace, service.name, err
            )
            return None
        mine = [s for s in slices if belongs_to(s, service.name)]
        return endpoints_from_slices(mine, service.port, _metrics_url)

    async def scrape() -> list[str | None]:
        """All gateways at once (one slow pod costs one timeout, not one per pod)."""
        listed = await asyncio.gather(*(pods(service) for service in services))
        targets = [*urls, *(url for found in listed if found is not None for url in found)]
        unlisted: list[str | None] = [None] * sum(found is None for found in listed)
        return [*await asyncio.gather(*(fetch(url) for url in targets)), *unlisted]

    if services and client is None:
        raise ValueError("a gateway service needs a Kubernetes client to list its pods")
    return scrape
