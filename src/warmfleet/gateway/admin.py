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
rejected with 400 naming the field, and the old setting stays. Admin changes last until the
next reload from the file (the file stays the source of truth).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from warmfleet.core.config import format_validation_error
from warmfleet.core.errors import BadRequestError, ConfigError, NotFoundError, WarmfleetError
from warmfleet.gateway.body import read_body
from warmfleet.gateway.config import InstanceSpec, parse_instance_list
from warmfleet.gateway.errors import ConflictError, UnauthorizedError, error_response
from warmfleet.gateway.fleet import build_router_or_raise
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.state import VariantRuntime
from warmfleet.routing.config import RoutingConfig

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_PREFIX = "/admin/v1"
_VARIANT = _PREFIX + "/endpoints/{endpoint}/variants/{variant}"


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(data).encode(), content_type="application/json"
    )


def validate(model: type[M], data: Any, source: str) -> M:
    """Validate or raise BadRequestError naming the first bad field (``param``) and all of them."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]["loc"] if err.errors() else ()
        param = ".".join(str(p) for p in first) or None
        raise BadRequestError(format_validation_error(err, source), param=param) from err


class AdminApi:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    def _authorize(self, request: web.Request) -> None:
        token = self.gw.state.admin_token
        if token is None:
            raise NotFoundError("the admin API is disabled (no admin token configured)")
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), token.encode()
        ):
            raise UnauthorizedError("missing or wrong admin bearer token")

    def _variant(self, request: web.Request) -> VariantRuntime:
        endpoint = self.gw.state.endpoint(request.match_info["endpoint"])
        return endpoint.variant(request.match_info["variant"])

    async def _body(self, request: web.Request) -> Any:
        raw = await read_body(request, self.gw.state.limits)
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as err:
            raise BadRequestError(f"body is not valid UTF-8 JSON: {err}", param="body") from err

    def guard(self, handler: Handler) -> Handler:
        """Authorization and error mapping around one admin handler. (A wrapper, not a
        middleware: any middleware would make aiohttp wrap every public request too.)"""

        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                self._authorize(request)
                return await handler(request)
            except WarmfleetError as err:
                return error_response(err)

        return guarded

    async def list_endpoints(self, _request: web.Request) -> web.Response:
        return _json(self.gw.state.describe())

    async def get_variant(self, request: web.Request) -> web.Response:
        return _json(self._variant(request).describe())

    async def get_routing(self, request: web.Request) -> web.Response:
        return _json(self._variant(request).routing_config.model_dump(mode="json"))

    async def put_routing(self, request: web.Request) -> web.Response:
        variant = self._variant(request)
        routing = validate(RoutingConfig, await self._body(request), "routing")
        try:
            build_router_or_raise(self.gw.state.factory, routing, "routing")
        except ConfigError as err:
            raise BadRequestError(str(err), param="routing") from err
        variant.set_routing(routing)
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.routing_config.model_dump(mode="json"))

    async def get_instances(self, request: web.Request) -> web.Response:
        return _json(self._variant(request).describe()["instances"])

    def _static(self, variant: VariantRuntime) -> VariantRuntime:
        if variant.discovery is not None:
            raise ConflictError(
                f"variant {variant.name!r} takes its instances from {variant.discovery.path}"
            )
        return variant

    async def put_instances(self, request: web.Request) -> web.Response:
        variant = self._static(self._variant(request))
        data = await self._body(request)
        try:
            listing = parse_instance_list(data, "instances")
        except ConfigError as err:
            raise BadRequestError(str(err), param="instances") from err
        variant.replace_static_instances(listing.instances)
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.describe()["instances"])

    async def post_instance(self, request: web.Request) -> web.Response:
        variant = self._static(self._variant(request))
        spec = validate(InstanceSpec, await self._body(request), "instance")
        if spec.id in variant.instances:
            raise ConflictError(f"instance {spec.id!r} already exists in variant {variant.name!r}")
        variant.add_instance(spec)
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.describe()["instances"], status=201)

    async def delete_instance(self, request: web.Request) -> web.Response:
        variant = self._static(self._variant(request))
        variant.remove_instance(request.match_info["instance"])
        self.gw.metrics.reloads.labels("admin", "ok").inc()
        return _json(variant.describe()["instances"])

    async def reload(self, _request: web.Request) -> web.Response:
        if self.gw.config_path is None:
            raise ConflictError("the gateway was not started from a config file")
        if not self.gw.reload(source="admin"):
            raise BadRequestError(
                "the config file was rejected; see the gateway log", param="config"
            )
        return _json(self.gw.state.describe())


def add_admin_routes(app: web.Application, gateway: Gateway) -> None:
    api = AdminApi(gateway)
    g = api.guard
    r = app.router
    variant = _VARIANT
    r.add_get(_PREFIX + "/endpoints", g(api.list_endpoints), allow_head=False)
    r.add_get(variant, g(api.get_variant), allow_head=False)
    r.add_get(variant + "/routing", g(api.get_routing), allow_head=False)
    r.add_put(variant + "/routing", g(api.put_routing))
    r.add_get(variant + "/instances", g(api.get_instances), allow_head=False)
    r.add_put(variant + "/instances", g(api.put_instances))
    r.add_post(variant + "/instances", g(api.post_instance))
    r.add_delete(variant + "/instances/{instance}", g(api.delete_instance))
    r.add_post(_PREFIX + "/reload", g(api.reload))
