"""Public routes: the OpenAI API, native invocations, health, readiness and metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any
from urllib.parse import parse_qs

from warmfleet.core.errors import BadRequestError, NotFoundError, WarmfleetError
from warmfleet.core.types import RoutingKey
from warmfleet.gateway.errors import error_response, status_and_type
from warmfleet.gateway.flow import FlowIdentity, flow_identity
from warmfleet.gateway.http.messages import Request, Response
from warmfleet.gateway.http.routes import Routes
from warmfleet.gateway.metrics import CONTENT_TYPE
from warmfleet.gateway.openai.body import (
    BodyKind,
    check_key_body_size,
    free_in_steps,
    openai_fields,
    parse_request_body,
    yield_gil,
)
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.server_config import LimitsConfig
from warmfleet.gateway.variant import RouterLike, VariantRuntime
from warmfleet.gateway.world import EndpointRuntime
from warmfleet.routing.parse import (
    parse_chat,
    parse_completions,
    parse_embeddings,
    parse_native,
    parse_responses,
)
from warmfleet.routing.request import KeyRequest
from warmfleet.routing.sessions import session_from_headers

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
EMBEDDINGS_PATH = "/v1/embeddings"
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

# Parses a body into its typed request: parse_chat or parse_completions (body, tenant header
# value, tenant header name, session header value).
Parse = Callable[[Mapping[str, Any], str | None, str, str | None], KeyRequest]


def _parse_offloaded(raw: bytes, limits: LimitsConfig, kind: BodyKind) -> tuple[list[Any], str]:
    """On the body worker: the parsed body (inside a holder the key job empties, so the body is
    freed on the worker: 150,000 objects take milliseconds to free) and its model."""
    body = parse_request_body(raw, limits, kind=kind, yielding=True)
    yield_gil()
    return [body], openai_fields(body)[0]


def _key_offloaded(
    router: RouterLike, parse: Parse, holder: list[Any], names: tuple[str | None, str, str | None]
) -> tuple[RoutingKey, str | None, str | None]:
    """On the body worker: the key of the body in ``holder``, parsed into its request there
    (both are freed there), with the request's tenant and session (flow control's);
    ``names``: the tenant header's value and name, the session header's value."""
    body = holder.pop()
    parsed = parse(body, *names)
    yield_gil()
    out = router.key(parsed), parsed.tenant, parsed.session
    yield_gil()
    del parsed
    free_in_steps(body)
    return out


def _flow(variant: VariantRuntime, request: Request, parsed: KeyRequest) -> FlowIdentity | None:
    """The request's flow identity when its variant runs flow control (else None: no cost)."""
    return _flow_of(variant, request, parsed.tenant, parsed.session)


def _flow_of(
    variant: VariantRuntime, request: Request, tenant: str | None, session: str | None
) -> FlowIdentity | None:
    if variant.routing_config.flow is None:
        return None
    return flow_identity(request.headers, tenant, session)


def _utility_model(raw: bytes, limits: LimitsConfig, kind: BodyKind, yielding: bool) -> str | None:
    """The ``model`` of a utility route's body: optional (vLLM's ``/tokenize`` and
    ``/detokenize`` take none), else a non-empty string."""
    body = parse_request_body(raw, limits, kind=kind, yielding=yielding)
    model = body.get("model")
    if yielding:  # on the body worker: freed in steps there
        yield_gil()
        free_in_steps(body)
    if model is not None and (not isinstance(model, str) or not model):
        raise BadRequestError("'model' must be a non-empty string", param="model")
    return model


class Handlers:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway
        self.state = gateway.state

    def _not_understood(self, err: Exception) -> Response:
        """A validation gap of the routing core (``_DEFENSIVE``): a 400, never a 500."""
        log.warning("routing key failed on a request body: %r", err)
        return self.reject(BadRequestError(f"request body not understood: {type(err).__name__}"))

    def _pick(
        self, request: Request, endpoint: EndpointRuntime, model: str | None, size_bytes: int
    ) -> tuple[VariantRuntime, str | None, str | None]:
        """The variant that takes the request (header, else weights) and the request's tenant
        and session headers under that variant's key settings; a body too big for its key mode
        is refused here."""
        state = self.state
        headers = request.headers
        variant = endpoint.pick_variant(model, headers.get(state.variant_header), state.rng)
        key_spec = variant.routing_config.key
        check_key_body_size(size_bytes, key_spec.mode, state.limits)
        session = session_from_headers(headers, key_spec.session_headers)
        return variant, headers.get(key_spec.tenant_header.lower()), session

    def reject(self, err: WarmfleetError) -> Response:
        self.gw.metrics.rejected.labels(str(status_and_type(err)[0])).inc()
        return error_response(err)

    async def chat_completions(self, request: Request) -> Response | None:
        return await self._openai(request, CHAT_PATH, parse_chat, kind="chat")

    async def completions(self, request: Request) -> Response | None:
        return await self._openai(request, COMPLETIONS_PATH, parse_completions, kind="completions")

    async def responses(self, request: Request) -> Response | None:
        """``POST /v1/responses``: keyed as the chat it renders (``parse_responses``)."""
        return await self._openai(request, RESPONSES_PATH, parse_responses, kind="responses")

    async def embeddings(self, request: Request) -> Response | None:
        """``POST /v1/embeddings``: keyed on its inputs, as a completions batch."""
        return await self._openai(request, EMBEDDINGS_PATH, parse_embeddings, kind="embeddings")

    async def _openai(
        self, request: Request, path: str, parse: Parse, *, kind: BodyKind
    ) -> Response | None:
        """Parse, check the limits, pick the variant, parse the body into its typed request (the
        variant's key settings name the tenant header) and build its key. A body over
        ``limits.offload_body_bytes`` is parsed and keyed on the body worker thread (the
        variant is picked on the loop, which owns the state); small ones stay inline."""
        t_start = perf_counter()
        state = self.state
        limits = state.limits
        raw = request.body
        if len(raw) > limits.offload_body_bytes:
            return await self._openai_offloaded(request, path, parse, kind=kind, t_start=t_start)
        try:
            body = parse_request_body(raw, limits, kind=kind)
            model, _stream = openai_fields(body)
            endpoint = state.openai_endpoint(model)
            variant, tenant, session = self._pick(request, endpoint, model, len(raw))
            router = variant.router
            tenant_header = variant.routing_config.key.tenant_header
            parsed = parse(body, tenant, tenant_header, session)
            key = router.key(parsed)
            flow = _flow(variant, request, parsed)
        except WarmfleetError as err:
            return self.reject(err)
        except _DEFENSIVE as bug:
            return self._not_understood(bug)
        return await self.gw.proxy.forward(
            request,
            variant,
            router=router,
            key=key,
            path=path,
            t_start=t_start,
            model=model,
            flow=flow,
        )

    async def _openai_offloaded(
        self, request: Request, path: str, parse: Parse, *, kind: BodyKind, t_start: float
    ) -> Response | None:
        """``_openai`` for a big body: parsed and keyed on the body worker (where the body is
        also freed); the variant is picked here, on the loop, which owns the state."""
        state = self.state
        worker = self.gw.body_worker
        holder: list[Any] = []
        try:
            holder, model = await worker.run(_parse_offloaded, request.body, state.limits, kind)
            endpoint = state.openai_endpoint(model)
            variant, tenant, session = self._pick(request, endpoint, model, len(request.body))
            router = variant.router
            tenant_header = variant.routing_config.key.tenant_header
            names = (tenant, tenant_header, session)
            key, tenant, session = await worker.run(_key_offloaded, router, parse, holder, names)
            flow = _flow_of(variant, request, tenant, session)
        except WarmfleetError as err:
            return self.reject(err)
        except _DEFENSIVE as bug:
            return self._not_understood(bug)
        finally:
            if holder:  # not keyed (rejected, cancelled): free the body on the worker too
                worker.discard(holder)
        return await self.gw.proxy.forward(
            request,
            variant,
            router=router,
            key=key,
            path=path,
            t_start=t_start,
            model=model,
            flow=flow,
        )

    async def invocations(self, request: Request) -> Response | None:
        """Native API: routes on the raw body bytes and the tenant header; no JSON parsing (a
        body over ``limits.offload_body_bytes`` is keyed on the body worker thread)."""
        t_start = perf_counter()
        state = self.state
        limits = state.limits
        try:
            endpoint = state.endpoint(request.match_info["endpoint"])
            raw = request.body
            variant, tenant, session = self._pick(request, endpoint, None, len(raw))
            router = variant.router
            model = variant.config.models[0] if variant.config.models else endpoint.name
            tenant_header = variant.routing_config.key.tenant_header
            native = parse_native(raw, tenant, model, tenant_header, session)
            if len(raw) > limits.offload_body_bytes:
                key = await self.gw.body_worker.run(router.key, native)
            else:
                key = router.key(native)
            flow = _flow(variant, request, native)
        except WarmfleetError as err:
            return self.reject(err)
        except _DEFENSIVE as bug:
            log.warning("routing key failed on an invocation: %r", bug)
            return self.reject(BadRequestError(f"request not understood: {type(bug).__name__}"))
        path = variant.config.invocations_path
        return await self.gw.proxy.forward(
            request,
            variant,
            router=router,
            key=key,
            path=path,
            t_start=t_start,
            model=model,
            flow=flow,
        )

    async def tokenize(self, request: Request) -> Response | None:
        return await self._utility(request, "/tokenize", "tokenize")

    async def detokenize(self, request: Request) -> Response | None:
        return await self._utility(request, "/detokenize", "detokenize")

    async def version(self, request: Request) -> Response | None:
        return await self._utility(request, "/version", None)

    async def _utility(self, request: Request, path: str, kind: BodyKind | None) -> Response | None:
        """vLLM's utility routes (a body of ``kind``; ``None``: a GET): to a healthy instance of
        the variant serving the body's ``model`` (without one: any variant of the default
        endpoint), chosen by the variant's strategy with a key of no prompt and a random prefix
        hash, so nothing is learnt from it and the calls spread."""
        t_start = perf_counter()
        state = self.state
        limits = state.limits
        model = None
        try:
            if kind is not None and len(request.body) > limits.offload_body_bytes:
                run = self.gw.body_worker.run
                model = await run(_utility_model, request.body, limits, kind, True)
            elif kind is not None:
                model = _utility_model(request.body, limits, kind, False)
            endpoint = state.openai_endpoint(model)
            requested = request.headers.get(state.variant_header)
            variant = endpoint.pick_variant(model, requested, state.rng)
        except WarmfleetError as err:
            return self.reject(err)
        key = RoutingKey((), 1, 0, 0, state.rng.getrandbits(64))
        method = "GET" if kind is None else "POST"
        return await self.gw.proxy.forward(
            request,
            variant,
            router=variant.router,
            key=key,
            path=path,
            t_start=t_start,
            method=method,
        )

    async def models(self, _request: Request) -> Response:
        try:
            body = await self.gw.models.get()
        except WarmfleetError as err:
            return self.reject(err)
        return Response(200, body, _JSON)

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{model}`` (the OpenAI client's ``models.retrieve``)."""
        model = request.match_info["model"]
        try:
            card = await self.gw.models.card(model)
        except WarmfleetError as err:
            return self.reject(err)
        if card is None:
            return self.reject(NotFoundError(f"The model `{model}` does not exist."))
        return Response(200, card, _JSON)

    async def health(self, _request: Request) -> Response:
        return Response(200, b'{"status":"ok"}', _JSON)

    async def ready(self, request: Request) -> Response:
        """``/ready``: a health round completed, every endpoint has a healthy instance and, with
        ``spec.replicaSync``, this replica caught up with its peers (or gave up waiting).
        ``/ready?scope=gateway`` (the pods' readiness probe): this gateway can route, i.e. a
        health round completed, whatever the engines' state, so a fleet without engines yet
        does not take every gateway pod out of its Service (clients get 503s that say why,
        not refused connections)."""
        scope = parse_qs(request.query).get("scope", ["endpoints"])[-1]
        if scope not in ("endpoints", "gateway"):
            return self.reject(BadRequestError("scope must be 'endpoints' or 'gateway'"))
        unavailable = [
            name
            for name, endpoint in self.state.endpoints.items()
            if not any(v.healthy for v in endpoint.variants.values())
        ]
        rounds = self.gw.health.rounds_completed
        sync = self.gw.replica_sync  # with replica sync: not ready before catching up
        caught_up = sync is None or sync.caught_up
        ready = rounds > 0 and caught_up and (scope == "gateway" or not unavailable)
        body: dict[str, Any] = {
            "status": "ready" if ready else "not_ready",
            "scope": scope,
            "health_rounds": rounds,
            "unavailable": unavailable,
        }
        if sync is not None:
            body["replica_sync"] = {"origin": sync.origin, "caught_up": caught_up}
        return Response(200 if ready else 503, json.dumps(body).encode(), _JSON)

    async def metrics(self, _request: Request) -> Response:
        return Response(200, self.gw.metrics.render(), CONTENT_TYPE)


def add_public_routes(routes: Routes, handlers: Handlers) -> None:
    routes.add("POST", CHAT_PATH, handlers.chat_completions)
    routes.add("POST", COMPLETIONS_PATH, handlers.completions)
    routes.add("POST", RESPONSES_PATH, handlers.responses)
    routes.add("POST", EMBEDDINGS_PATH, handlers.embeddings)
    routes.add("POST", "/tokenize", handlers.tokenize)
    routes.add("POST", "/detokenize", handlers.detokenize)
    routes.add("GET", "/version", handlers.version)
    routes.add("GET", "/v1/models", handlers.models)
    routes.add("GET", "/v1/models/{model:path}", handlers.model)
    routes.add("POST", "/endpoints/{endpoint}/invocations", handlers.invocations)
    routes.add("GET", "/health", handlers.health)
    routes.add("GET", "/ready", handlers.ready)
    routes.add("GET", "/metrics", handlers.metrics)
