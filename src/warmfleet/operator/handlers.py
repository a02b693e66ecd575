"""kopf wiring: InferenceEndpoint events and a timer all trigger one level-triggered pass.

kopf owns the InferenceEndpoint finalizer: its delete handler runs passes until the reconciler
emits ``ReleaseEndpoint`` for that endpoint (Deployments, caches, node data, labels and image refs
all gone), then returns, and kopf removes the finalizer. Handler progress is kept in annotations
(not in ``status``), so the status subresource holds only warmfleet's status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import aiohttp
import kopf

from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.kube import client as kube
from warmfleet.kube.access import KubeAccessError, api_server, read_token, tls
from warmfleet.operator.controller import Controller
from warmfleet.operator.gateway_metrics import GatewayService, scraper

log = logging.getLogger(__name__)
GROUP, VERSION, PLURAL = "warmfleet.dev", "v1alpha1", "inferenceendpoints"


def in_cluster_server(spec: KubeApiSpec) -> tuple[str, str | None]:
    """The API server and the service account's token as ``warmfleet.kube.access`` finds them
    (the one way every shell locates the API server)."""
    try:
        return api_server(spec), read_token(spec.token_path)
    except KubeAccessError as err:
        raise kopf.LoginError(f"not in a cluster ({err}): pass a server") from err


def _session(spec: KubeApiSpec | None) -> aiohttp.ClientSession:
    if spec is None:
        return aiohttp.ClientSession()
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls(spec)))


def build_registry(
    namespace: str,
    *,
    server: str | None = None,
    token: str | None = None,
    interval_s: float = 5.0,
    clock: Callable[[], float] = time.time,
    gateway_metrics: Sequence[str] = (),
    gateway_services: Sequence[GatewayService] = (),
) -> kopf.OperatorRegistry:
    """A kopf registry bound to one namespace; ``server`` None means in-cluster credentials."""
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {}
    resource = (GROUP, VERSION, PLURAL)
    pod = KubeApiSpec()  # in a cluster: the service account's token, CA and the API's env vars

    def controller() -> Controller:
        ctl: Controller = state["controller"]
        return ctl

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.posting.enabled = False
        settings.watching.server_timeout = 60
        settings.networking.request_timeout = 30
        base, bearer = (server, token) if server is not None else in_cluster_server(pod)
        session = _session(None if server is not None else pod)
        state["session"] = session
        client = kube.KubeClient(
            session,
            base,
            token=bearer if server is not None else partial(read_token, pod.token_path),
        )
        metrics = (
            scraper(session, gateway_metrics, gateway_services, client)
            if gateway_metrics or gateway_services
            else None
        )
        state["controller"] = Controller(client, namespace, clock, metrics=metrics)

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        session = state.pop("session", None)
        if session is not None:
            await session.close()

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        base, bearer = (server, token) if server is not None else in_cluster_server(pod)
        if server is None:
            return kopf.ConnectionInfo(server=base, token=bearer, ca_path=pod.ca_path)
        return kopf.ConnectionInfo(server=base, token=bearer)

    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    @kopf.on.resume(*resource, registry=registry)
    async def _changed(**_: Any) -> None:
        await controller().reconcile()

    @kopf.timer(*resource, interval=interval_s, registry=registry)
    async def _tick(**_: Any) -> None:
        await controller().reconcile()

    @kopf.on.delete(*resource, registry=registry)
    async def _deleted(name: str, **_: Any) -> None:
        result = await controller().reconcile()
        if name not in result.released:
            raise kopf.TemporaryError("garbage collection in progress", delay=interval_s)

    return registry


def run_operator(
    namespace: str,
    gateway_metrics: Sequence[str] = (),
    gateway_services: Sequence[GatewayService] = (),
) -> None:
    """Run against the cluster this pod is in (service-account credentials)."""
    registry = build_registry(
        namespace, gateway_metrics=gateway_metrics, gateway_services=gateway_services
    )
    kopf.configure(verbose=False)
    kopf.run(registry=registry, namespaces=[namespace], standalone=True, clusterwide=False)
