"""A small Kubernetes REST client on aiohttp: list, create, merge-patch, delete (with timeouts).

Only what the operator needs. Label filtering is done client-side on listed objects, so the same
code runs against a real API server and against kmock (which ignores label selectors).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from warmfleet.core.errors import WarmfleetError
from warmfleet.kube.endpointslices import served_versions, slice_version

log = logging.getLogger(__name__)
CONFLICT_ATTEMPTS = 5
CONFLICT = 409

Obj = dict[str, Any]


class KubeError(WarmfleetError):
    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if sub is not None:
            base += f"/{sub}"
        return base


NODES = Resource("", "v1", "nodes", namespaced=False)
PODS = Resource("", "v1", "pods")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
DAEMONSETS = Resource("apps", "v1", "daemonsets")
SERVICES = Resource("", "v1", "services")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices")  # KubeClient.endpoint_slices
ENDPOINTS = Resource("warmfleet.dev", "v1alpha1", "inferenceendpoints")
MODEL_CACHES = Resource("warmfleet.dev", "v1alpha1", "modelcaches")
IMAGE_CACHES = Resource("warmfleet.dev", "v1alpha1", "imagecaches")


class KubeClient:
    """One aiohttp session against ``server`` (a base URL), optional bearer token: a string, or
    a function called for every request (a projected service-account token file is rotated by
    the kubelet, so it must be re-read, as kopf's login and the gateway's client do)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        server: str,
        *,
        token: str | Callable[[], str | None] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._session = session
        self._server = server.rstrip("/")
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._slices: Resource | None = None
        self.conflicts_retried = 0

    @property
    def _headers(self) -> dict[str, str]:
        token = self._token() if callable(self._token) else self._token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _call(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        content_type: str = "application/json",
    ) -> Obj:
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with self._session.request(
            method, self._server + path, data=data, headers=headers, timeout=self._timeout
        ) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise KubeError(
                    f"{method} {path}: HTTP {resp.status}: {text[:300]}", status=resp.status
                )
            result: Obj = json.loads(text) if text else {}
            return result

    async def list(
        self, resource: Resource, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        data = await self._call("GET", resource.path(namespace))
        items: list[Obj] = data.get("items", [])
        if labels:
            items = [i for i in items if _has_labels(i, labels)]
        return items

    async def get(self, resource: Resource, namespace: str | None, name: str) -> Obj | None:
        try:
            return await self._call("GET", resource.path(namespace, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    async def create(self, resource: Resource, namespace: str | None, body: Obj) -> Obj:
        return await self._call("POST", resource.path(namespace), body)

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        sub: str | None = None,
    ) -> Obj:
        path = resource.path(namespace, name, sub)
        return await self._call("PATCH", path, body, content_type="application/merge-patch+json")

    async def apply(
        self,
        resource: Resource,
        namespace: str | None,
        body: Obj,
        *,
        exact: Sequence[tuple[str, ...]] = (),
    ) -> Obj:
        """Create, or merge-patch the existing object to ``body`` (idempotent). A merge patch
        keeps map keys it does not mention: at each ``exact`` path the object ends up exactly
        as in ``body`` (keys ``body`` lacks there are removed, an absent path is removed)."""

        def change(current: Obj) -> Obj:
            return exact_patch(current, body, exact)

        name = body["metadata"]["name"]
        result = await self.update(resource, namespace, name, change, create=body)
        assert result is not None  # created when missing
        return result

    async def update(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        *,
        create: Obj | None = None,
        sub: str | None = None,
    ) -> Obj | None:
        """Read-modify-write with optimistic concurrency: the merge patch ``change(current)``
        carries the ``resourceVersion`` it was computed from, so the API server refuses it
        (409) if the object changed since; then it is read and computed again, at most
        ``CONFLICT_ATTEMPTS`` times (``conflicts_retried`` counts the retries). A missing
        object is created from ``create`` (an object created meanwhile is a conflict too);
        without ``create`` the result is ``None``. ``sub``: the patch goes to that subresource
        (``status``; the server checks the version there too, before it takes the status)."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            current = await self.get(resource, namespace, name)
            try:
                if current is None:
                    return (
                        None if create is None else await self.create(resource, namespace, create)
                    )
                patch = change(current)
                version = (current.get("metadata") or {}).get("resourceVersion")
                if version:  # an API emulator may not version objects
                    patch.setdefault("metadata", {})["resourceVersion"] = version
                return await self.patch(resource, namespace, name, patch, sub=sub)
            except KubeError as err:
                if err.status != CONFLICT or attempt == CONFLICT_ATTEMPTS:
                    raise
                self.conflicts_retried += 1
                log.info("%s %s changed since it was read (%s): read again", resource.plural,
                         name, err)  # fmt: skip
        raise AssertionError("unreachable")  # pragma: no cover

    async def endpoint_slices(self) -> Resource:
        """EndpointSlices at the version the server serves (v1, else v1beta1: Kubernetes
        1.21-1.24 serve both, 1.20 only v1beta1, 1.25 on only v1); discovered once."""
        if self._slices is None:
            group_doc = await self._call("GET", f"/apis/{ENDPOINT_SLICES.group}")
            version = slice_version(served_versions(group_doc))
            self._slices = replace(ENDPOINT_SLICES, version=version)
        return self._slices

    async def delete(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        *,
        uid: str = "",
        resource_version: str = "",
    ) -> None:
        """Delete (an object already gone is no error). ``uid`` / ``resource_version``: the
        API server deletes only that very object, as read (``DeleteOptions.preconditions``);
        one deleted and created again, or changed, since is refused with a 409
        (``KubeError.status``), left to the caller."""
        preconditions = {"uid": uid, "resourceVersion": resource_version}
        preconditions = {k: v for k, v in preconditions.items() if v}
        # no apiVersion/kind: the server reads a DeleteOptions of its own group version
        body = {"preconditions": preconditions} if preconditions else None
        try:
            await self._call("DELETE", resource.path(namespace, name), body)
        except KubeError as err:
            if err.status != 404:
                raise


def merge_patch(current: Any, desired: Any) -> Any:
    """The JSON merge patch (RFC 7386) turning ``current`` into ``desired``: keys that only
    ``current`` has are set to null (removed), nested maps are patched the same way."""
    if not isinstance(current, dict) or not isinstance(desired, dict):
        return desired
    patch = {k: merge_patch(current.get(k), v) for k, v in desired.items()}
    patch.update({k: None for k in current if k not in desired})
    return patch


def exact_patch(current: Obj, body: Obj, exact: Sequence[tuple[str, ...]]) -> Obj:
    """The merge patch of ``apply``: ``body``, but at each ``exact`` path the merge patch that
    turns ``current``'s value there into ``body``'s (keys only ``current`` has are removed)."""
    patch = copy.deepcopy(body)
    for path in exact:
        merged = merge_patch(_get_path(current, path), _get_path(body, path))
        _set_path(patch, path, merged)
    return patch


def _get_path(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _set_path(obj: Obj, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        obj = obj.setdefault(key, {})
    obj[path[-1]] = value


def _has_labels(obj: Obj, labels: Mapping[str, str]) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())
