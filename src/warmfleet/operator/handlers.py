"""kopf wiring: InferenceEndpoint events and a timer all trigger one level-triggered pass.

kopf owns the InferenceEndpoint finalizer: its delete handler runs passes until the reconciler
emits ``ReleaseEndpoint`` for that endpoint (Deployments, caches, node data, labels and image refs
all gone), then returns, and kopf removes the finalizer. Handler progress is kept in annotations
(not in ``status``), so the status subresource holds only warmfleet's status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import kopf

from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.kube import client as kube
from warmfleet.kube.access import KubeAccess, KubeAccessError, json_or_raise
from warmfleet.operator.controller import Controller
from warmfleet.operator.gateway_metrics import GatewayService, scraper

log = logging.getLogger(__name__)
GROUP, VERSION, PLURAL = "warmfleet.dev", "v1alpha1", "inferenceendpoints"


def in_cluster_server(access: KubeAccess) -> tuple[str, str | None]:
    """The API server and the bearer token as ``warmfleet.kube.access`` finds them (the one way
    every shell locates the API server: the service account, or ``spec.kubeconfig``)."""
    try:
        return access.api_server(), access.bearer_token()
    except KubeAccessError as err:
        raise kopf.LoginError(f"not in a cluster ({err}): pass a kubeconfig") from err


def connection_info(access: KubeAccess) -> kopf.ConnectionInfo:
    """kopf's credentials for ``access``: the server, token and CA of the kubeconfig context,
    or of the service account."""
    base, bearer = in_cluster_server(access)
    try:
        context = access.kubeconfig_context()
    except KubeAccessError as err:
        raise kopf.LoginError(str(err)) from err
    if context is None:
        return kopf.ConnectionInfo(server=base, token=bearer, ca_path=access.spec.ca_path)
    return kopf.ConnectionInfo(
        server=base,
        token=bearer,
        ca_path=context.ca_path,
        ca_data=context.ca_pem,
        insecure=context.insecure or None,
        default_namespace=context.namespace,
    )


def build_registry(
    namespace: str,
    *,
    server: str | None = None,
    token: str | None = None,
    interval_s: float = 5.0,
    clock: Callable[[], float] = time.time,
    gateway_metrics: Sequence[str] = (),
    gateway_services: Sequence[GatewayService] = (),
    api: KubeApiSpec | None = None,
) -> kopf.OperatorRegistry:
    """A kopf registry bound to one namespace. ``server`` (and ``token``): that server, no TLS
    settings (tests); else ``api`` says how to reach it (default: in a cluster, the service
    account's token, CA and the API's env vars; ``api.kubeconfig``: outside one)."""
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {}
    pod = KubeAccess(api or KubeApiSpec())

    def controller() -> Controller:
        ctl: Controller = state["controller"]
        return ctl

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        _configure(settings)
        base, bearer = (server, token) if server is not None else in_cluster_server(pod)
        session = aiohttp.ClientSession() if server is not None else pod.session()
        state["session"] = session
        client = kube.KubeClient(
            session, base, token=bearer if server is not None else pod.bearer_token
        )
        watched = gateway_metrics or gateway_services
        metrics = scraper(session, gateway_metrics, gateway_services, client) if watched else None
        state["controller"] = Controller(client, namespace, clock, metrics=metrics)

    @kopf.on.cleanup(registry=registry)
    async def _cleanup(**_: Any) -> None:
        session = state.pop("session", None)
        if session is not None:
            await session.close()

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        if server is None:
            return connection_info(pod)
        return kopf.ConnectionInfo(server=server, token=token)

    _watch(registry, controller, interval_s)
    return registry


def _configure(settings: kopf.OperatorSettings) -> None:
    """kopf's settings: state in annotations under our group, no events posted, bounded
    watches and requests."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.enabled = False
    settings.watching.server_timeout = 60
    settings.networking.request_timeout = 30


def _watch(
    registry: kopf.OperatorRegistry, controller: Callable[[], Controller], interval_s: float
) -> None:
    """Every change of an InferenceEndpoint, and a timer, reconcile; a deletion waits for its
    garbage collection."""
    resource = (GROUP, VERSION, PLURAL)

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


async def _preflight(api: KubeApiSpec, namespace: str) -> None:
    access = KubeAccess(api)
    async with access.session() as http:
        url = f"{access.api_server()}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
        headers = access.auth_headers()
        try:
            async with http.get(
                url, params={"limit": "1"}, headers=headers, timeout=access.timeout()
            ) as resp:
                await json_or_raise(resp)
        except (aiohttp.ClientError, TimeoutError) as err:
            raise KubeAccessError(f"cannot reach {url}: {err or type(err).__name__}") from err


def preflight(api: KubeApiSpec, namespace: str) -> None:
    """List the namespace's InferenceEndpoints once: the server is there, the credentials are
    accepted and the CRD is installed. ``KubeAccessError`` (one line) otherwise, before kopf
    would retry its login forever."""
    asyncio.run(_preflight(api, namespace))


def run_operator(
    namespace: str,
    gateway_metrics: Sequence[str] = (),
    gateway_services: Sequence[GatewayService] = (),
    api: KubeApiSpec | None = None,
) -> None:
    """Run against the cluster ``api`` locates (default: the one this pod is in, with the
    service account's credentials). ``KubeAccessError`` if it cannot be reached or used."""
    api = api or KubeApiSpec()
    preflight(api, namespace)
    registry = build_registry(
        namespace, gateway_metrics=gateway_metrics, gateway_services=gateway_services, api=api
    )
    kopf.configure(verbose=False)
    kopf.run(registry=registry, namespaces=[namespace], standalone=True, clusterwide=False)
