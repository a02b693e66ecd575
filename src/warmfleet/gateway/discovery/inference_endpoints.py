"""Gateway endpoints from the fleet controller's ``InferenceEndpoint`` objects
(``spec.inference_endpoints``).

``derive_endpoints`` (pure) maps each object to a gateway endpoint of the same name, one variant
per production variant (name, ``trafficWeight``, ``routing``; it serves the model named like the
endpoint) whose instances come from the Service the operator makes for it,
``<endpoint>-<variant>`` (``discovery: {type: kubernetes}``), followed only while that Service's
controller is this very object (``service_owner_uid``: its ``metadata.uid``; another endpoint can
derive the same Service name, and the operator leaves it to its holder). Objects that are being
deleted, invalid, or named like an endpoint of the document are left out (the caller gets why).

``InferenceEndpointSync`` lists, then watches, the objects (``kube.watch.ListWatch``) and hands
every new set to the runtime, which applies the document plus these endpoints. Unchanged
endpoints keep their routers and instances; an API error keeps the last set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from warmfleet.api.names import service_name
from warmfleet.api.resources import InferenceEndpointSpec
from warmfleet.gateway.config import (
    EndpointConfig,
    InferenceEndpointsSource,
    KubernetesDiscovery,
    VariantConfig,
)
from warmfleet.gateway.kube_watch_config import KubeWatchSpec
from warmfleet.kube.access import read_own
from warmfleet.kube.watch import ListWatch, object_name

_PATH = "/apis/warmfleet.dev/v1alpha1/namespaces/{namespace}/inferenceendpoints"


def derive_endpoint(
    obj: Mapping[str, Any],
    source: InferenceEndpointsSource,
    namespace: str,
    problems: dict[str, str] | None = None,
) -> EndpointConfig | None:
    """The gateway endpoint for one InferenceEndpoint (``None``: left out; why, if it is
    invalid, goes to ``problems``)."""
    name = object_name(obj)
    meta = obj.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return None
    shared = source.model_dump(include=set(KubeWatchSpec.model_fields))
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    owner = {"service_owner_uid": uid} if isinstance(uid, str) and uid else {}
    try:
        spec = InferenceEndpointSpec.model_validate(obj.get("spec") or {})
        variants = [
            VariantConfig(
                name=v.name,
                weight=v.traffic_weight,
                models=[name],
                routing=v.routing,
                discovery=KubernetesDiscovery(
                    service=service_name(name, v.name),
                    **{**shared, "namespace": namespace, **owner},
                ),
            )
            for v in spec.variants
        ]
        return EndpointConfig(name=name, variants=variants)
    except ValidationError as err:
        if problems is not None:
            problems[name] = f"invalid: {err}"
        return None


def derive_endpoints(
    objects: Iterable[Mapping[str, Any]],
    source: InferenceEndpointsSource,
    namespace: str,
    taken: Iterable[str] = (),
    problems: dict[str, str] | None = None,
) -> list[EndpointConfig]:
    """Endpoints for ``objects`` (sorted by name), leaving out the names in ``taken``; why an
    object is left out goes to ``problems`` (name -> reason)."""
    taken = set(taken)
    out = []
    for obj in sorted(objects, key=object_name):
        endpoint = derive_endpoint(obj, source, namespace, problems)
        if endpoint is None:
            continue
        if endpoint.name in taken:
            if problems is not None:
                problems[endpoint.name] = "the gateway document defines that endpoint"
            continue
        out.append(endpoint)
    return out


class InferenceEndpointSync:
    """Follows the InferenceEndpoints of one namespace for the runtime.

    ``publish(objects, source, namespace)`` is called with the current objects after every
    change; ``failed(err, first)`` on API errors."""

    def __init__(
        self,
        source: InferenceEndpointsSource,
        publish: Callable[[list[Mapping[str, Any]], InferenceEndpointsSource, str], None],
        failed: Callable[[BaseException, bool], None],
    ) -> None:
        self.source = source
        self.namespace = ""

        def path() -> str:
            self.namespace = source.namespace or read_own(
                source.namespace_path, "spec.inference_endpoints.namespace"
            )
            return _PATH.format(namespace=self.namespace)

        self.watch = ListWatch(
            source,
            path,
            on_change=lambda objs: publish(list(objs.values()), source, self.namespace),
            on_error=failed,
            watch_timeout_s=source.watch_timeout_s,
            retry_interval_s=source.retry_interval_s,
        )

    async def run(self) -> None:
        await self.watch.run()
