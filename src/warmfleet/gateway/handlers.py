"""Public routes: the OpenAI API, native invocations, health, readiness and metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

from aiohttp import web

from warmfleet.core.errors import BadRequestError, WarmfleetError
from warmfleet.core.types import RoutingKey
from warmfleet.gateway.body import openai_fields, parse_json_object, read_body
from warmfleet.gateway.errors import error_response, plain_error, status_and_type
from warmfleet.gateway.metrics import CONTENT_TYPE
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.state import RouterLike

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_JSON = "application/json"
# Errors the routing core should have turned into BadRequestError; caught so bad input can never
# become a 500 even if a validation gap slips through.
_DEFENSIVE = (
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
    RecursionError,
    UnicodeError,
)

KeyFn = Callable[[RouterLike, Mapping[str, Any], str | None], RoutingKey]


def _chat_key(router: RouterLike, body: Mapping[str, Any], tenant: str | None) -> RoutingKey:
    return router.key_for_chat(body, tenant)


def _completions_key(router: RouterLike, body: Mapping[str, Any], tenant: str | None) -> RoutingKey:
    return router.key_for_completions(body, tenant)


class Handlers:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.state = gateway.state

    def reject(self, err: WarmfleetError) -> web.Response:
        self.gw.metrics.rejected.labels(str(status_and_type(err)[0])).inc()
        return error_response(err)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, CHAT_PATH, _chat_key)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, COMPLETIONS_PATH, _completions_key)

    async def _openai(self, request: web.Request, path: str, key_fn: KeyFn) -> web.StreamResponse:
        t_start = perf_counter()
        state = self.state
        try:
            raw = await read_body(request, state.limits)
            body = parse_json_object(raw)
            model, _stream = openai_fields(body)
            endpoint = state.default_endpoint()
            variant = endpoint.pick_variant(
                model, request.headers.get(state.variant_header), state.rng
            )
            router = variant.router
            tenant = request.headers.get(variant.routing_config.key.tenant_header)
            key = key_fn(router, body, tenant)
        except WarmfleetError as err:
            return self.reject(err)
        except _DEFENSIVE as err:
            log.warning("routing key failed on a request body: %r", err)
            return self.reject(
                BadRequestError(f"request body not understood: {type(err).__name__}")
            )
        return await self.gw.proxy.forward(
            request, variant, router=router, key=key, raw=raw, path=path, t_start=t_start
        )

    async def invocations(self, request: web.Request) -> web.StreamResponse:
        """Native API: routes on the raw body bytes and the tenant header; no JSON parsing."""
        t_start = perf_counter()
        state = self.state
        try:
            endpoint = state.endpoint(request.match_info["endpoint"])
            raw = await read_body(request, state.limits)
            variant = endpoint.pick_variant(
                None, request.headers.get(state.variant_header), state.rng
            )
            router = variant.router
            tenant = request.headers.get(variant.routing_config.key.tenant_header)
            model = variant.config.models[0] if variant.config.models else endpoint.name
            key = router.key_for_bytes(raw, tenant, model)
        except WarmfleetError as err:
            return self.reject(err)
        except _DEFENSIVE as err:
            log.warning("routing key failed on an invocation: %r", err)
            return self.reject(BadRequestError(f"request not understood: {type(err).__name__}"))
        path = variant.config.invocations_path
        return await self.gw.proxy.forward(
            request, variant, router=router, key=key, raw=raw, path=path, t_start=t_start
        )

    async def models(self, _request: web.Request) -> web.Response:
        try:
            body = await self.gw.models.get()
        except WarmfleetError as err:
            return self.reject(err)
        return web.Response(body=body, content_type=_JSON)

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(body=b'{"status":"ok"}', content_type=_JSON)

    async def ready(self, _request: web.Request) -> web.Response:
        """Ready once a health round completed and every endpoint has a healthy instance."""
        unavailable = [
            name
            for name, endpoint in self.state.endpoints.items()
            if not any(v.healthy for v in endpoint.variants.values())
        ]
        rounds = self.gw.health.rounds_completed
        ready = rounds > 0 and not unavailable
        body = {
            "status": "ready" if ready else "not_ready",
            "health_rounds": rounds,
            "unavailable": unavailable,
        }
        return web.Response(
            status=200 if ready else 503, body=json.dumps(body).encode(), content_type=_JSON
        )

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.gw.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def not_found(self, request: web.Request) -> web.Response:
        self.gw.metrics.rejected.labels("404").inc()
        return plain_error(404, f"no route for {request.method} {request.path}", "not_found_error")

    async def method_not_allowed(self, request: web.Request) -> web.Response:
        self.gw.metrics.rejected.labels("405").inc()
        return plain_error(
            405, f"method {request.method} not allowed on {request.path}", "invalid_request_error"
        )


def add_public_routes(app: web.Application, handlers: Handlers) -> None:
    r = app.router
    r.add_post(CHAT_PATH, handlers.chat_completions)
    r.add_post(COMPLETIONS_PATH, handlers.completions)
    r.add_get("/v1/models", handlers.models, allow_head=False)
    r.add_post("/endpoints/{endpoint}/invocations", handlers.invocations)
    r.add_get("/health", handlers.health, allow_head=False)
    r.add_get("/ready", handlers.ready, allow_head=False)
    r.add_get("/metrics", handlers.metrics, allow_head=False)
    for path in (CHAT_PATH, COMPLETIONS_PATH, "/v1/models", "/endpoints/{endpoint}/invocations"):
        r.add_route("*", path, handlers.method_not_allowed)
    for path in ("/health", "/ready", "/metrics"):
        r.add_route("*", path, handlers.method_not_allowed)
