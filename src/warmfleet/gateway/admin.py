"""Admin API (bearer token; answers 404 while no token is configured).

    GET    /admin/v1/endpoints
    GET    /admin/v1/endpoints/{endpoint}/variants/{variant}
    GET    /admin/v1/endpoints/{endpoint}/variants/{variant}/routing
    PUT    /admin/v1/endpoints/{endpoint}/variants/{variant}/routing     body: RoutingConfig
    GET    /admin/v1/endpoints/{endpoint}/variants/{variant}/instances
    PUT    /admin/v1/endpoints/{endpoint}/variants/{variant}/instances   body: {"instances": [...]}
    POST   /admin/v1/endpoints/{endpoint}/variants/{variant}/instances   body: {"id", "url"}
    DELETE /admin/v1/endpoints/{endpoint}/variants/{variant}/instances/{instance}
    POST   /admin/v1/reload                                              re-read the config file

Changes apply to the next request; in-flight requests keep their instance. An invalid body is
rejected with 400 naming the field, and the old setting stays; so is a routing change after
which the whole document would no longer validate (``kvEvents`` needs exactly one variant in
``tokens`` key mode: the message names the rule, ``param`` is ``routing``). Admin changes last
until the next reload from the file (the file stays the source of truth); a change of the
InferenceEndpoints (``spec.inference_endpoints``) leaves them alone. The endpoints derived from
InferenceEndpoints are changed through the objects: their routing and instances answer 409.
A variant, in the endpoints' list and alone, has ``discovery_problem``: why its Kubernetes
discovery gives it no instances (its Service is another InferenceEndpoint's, or missing), else
``null``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from warmfleet.core.config import error_path, format_validation_error, new_spellings
from warmfleet.core.errors import BadRequestError, ConfigError, NotFoundError, WarmfleetError
from warmfleet.gateway.config import (
    FileDiscovery,
    InstanceSpec,
    KubernetesDiscovery,
    parse_instance_list,
)
from warmfleet.gateway.errors import ConflictError, UnauthorizedError, error_response
from warmfleet.gateway.http.messages import Request, Response
from warmfleet.gateway.http.routes import Routes
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.gateway.world import build_router_or_raise
from warmfleet.routing.config import RoutingConfig

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
_PREFIX = "/admin/v1"
_VARIANT = _PREFIX + "/endpoints/{endpoint}/variants/{variant}"


def _json(data: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(data).encode())


def validate(model: type[M], data: Any, source: str) -> M:
    """Validate or raise BadRequestError naming the first bad field (``param``) and all of them."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = err.errors()
        # a body of the wrong type altogether has an empty path: no field to name
        param = (error_path(errors[0], new_spellings(model)) or None) if errors else None
        raise BadRequestError(format_validation_error(err, source, model), param=param) from err


class AdminApi:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    def _authorize(self, request: Request) -> None:
        token = self.gw.state.admin_token
        if token is None:
            raise NotFoundError("the admin API is disabled (no admin token configured)")
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), token.encode()
        ):
            raise UnauthorizedError("missing or wrong admin bearer token")

    def _variant(self, request: Request) -> VariantRuntime:
        endpoint = self.gw.state.endpoint(request.match_info["endpoint"])
        return endpoint.variant(request.match_info["variant"])

    async def _body(self, request: Request) -> Any:
        try:
            return json.loads(request.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as err:
            raise BadRequestError(f"body is not valid UTF-8 JSON: {err}", param="body") from err

    def guard(self, handler: Handler) -> Handler:
        """Authorization and error mapping around one admin handler."""

        async def guarded(request: Request) -> Response:
            try:
                self._authorize(request)
                return await handler(request)
            except WarmfleetError as err:
                return error_response(err)

        return guarded

    def _described(self, endpoint: str, variant: dict[str, Any]) -> dict[str, Any]:
        """A variant as ``describe`` has it, plus why its Kubernetes discovery gives it no
        instances (``discovery_problem``; ``None``: nothing to say)."""
        variant["discovery_problem"] = self.gw.kube_discovery.problem(endpoint, variant["name"])
        return variant

    async def list_endpoints(self, _request: Request) -> Response:
        described = self.gw.state.describe()
        for endpoint in described["endpoints"]:
            for variant in endpoint["variants"]:
                self._described(endpoint["name"], variant)
        return _json(described)

    async def get_variant(self, request: Request) -> Response:
        variant = self._variant(request)
        return _json(self._described(variant.endpoint, variant.describe()))

    async def get_routing(self, request: Request) -> Response:
        return _json(self._variant(request).routing_config.model_dump(mode="json"))

    async def put_routing(self, request: Request) -> Response:
        variant = self._variant(request)
        if variant.endpoint in self.gw.derived_endpoints:
            raise ConflictError(
                f"endpoint {variant.endpoint!r} comes from the InferenceEndpoint of that name: "
                "change the routing of its variant there"
            )
        routing = validate(RoutingConfig, await self._body(request), "routing")
        try:
            build_router_or_raise(self.gw.state.factory, routing, "routing")
            # the whole document with it (kvEvents: exactly one tokens-mode variant), as
            # what is in force and what a change of the InferenceEndpoints re-applies
            changed = variant.config.model_copy(update={"routing": routing})
            self.gw.check_variant(variant.endpoint, changed)
        except ConfigError as err:
            raise BadRequestError(str(err), param="routing") from err
        variant.set_routing(routing)
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.routing_config.model_dump(mode="json"))

    async def get_instances(self, request: Request) -> Response:
        return _json(self._variant(request).describe()["instances"])

    def _static(self, variant: VariantRuntime) -> VariantRuntime:
        disc = variant.config.discovery
        if isinstance(disc, FileDiscovery | KubernetesDiscovery):
            raise ConflictError(f"variant {variant.name!r} takes its instances from {disc.source}")
        return variant

    async def put_instances(self, request: Request) -> Response:
        variant = self._static(self._variant(request))
        data = await self._body(request)
        try:
            listing = parse_instance_list(data, "instances")
        except ConfigError as err:
            raise BadRequestError(str(err), param="instances") from err
        variant.replace_static_instances(listing.instances)
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.describe()["instances"])

    async def post_instance(self, request: Request) -> Response:
        variant = self._static(self._variant(request))
        spec = validate(InstanceSpec, await self._body(request), "instance")
        if spec.id in variant.instances:
            raise ConflictError(f"instance {spec.id!r} already exists in variant {variant.name!r}")
        variant.add_instance(spec)
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.describe()["instances"], status=201)

    async def delete_instance(self, request: Request) -> Response:
        variant = self._static(self._variant(request))
        variant.remove_instance(request.match_info["instance"])
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.describe()["instances"])

    async def reload(self, _request: Request) -> Response:
        if self.gw.config_path is None:
            raise ConflictError("the gateway was not started from a config file")
        if not self.gw.reload(source="admin"):
            raise BadRequestError(
                "the config file was rejected; see the gateway log", param="config"
            )
        return _json(self.gw.state.describe())


def add_admin_routes(routes: Routes, api: AdminApi) -> None:
    g = api.guard
    variant = _VARIANT
    routes.add("GET", _PREFIX + "/endpoints", g(api.list_endpoints))
    routes.add("GET", variant, g(api.get_variant))
    routes.add("GET", variant + "/routing", g(api.get_routing))
    routes.add("PUT", variant + "/routing", g(api.put_routing))
    routes.add("GET", variant + "/instances", g(api.get_instances))
    routes.add("PUT", variant + "/instances", g(api.put_instances))
    routes.add("POST", variant + "/instances", g(api.post_instance))
    routes.add("DELETE", variant + "/instances/{instance}", g(api.delete_instance))
    routes.add("POST", _PREFIX + "/reload", g(api.reload))
