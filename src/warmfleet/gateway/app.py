"""App factory: ``create_app(config)`` builds the aiohttp application of one gateway."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from warmfleet.gateway.admin import AdminApi, add_admin_routes
from warmfleet.gateway.config import GatewayConfig
from warmfleet.gateway.handlers import Handlers, add_public_routes
from warmfleet.gateway.kv_events.service import KvEventService
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.state import RouterFactory, RouterLike
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.keys import Tokenizer
from warmfleet.routing.router import Router

GATEWAY_KEY = web.AppKey("warmfleet_gateway", Gateway)


def default_router_factory(config: RoutingConfig, rng: random.Random) -> RouterLike:
    """The routing core's facade (no tokenizer: key modes text and bytes)."""
    return Router(config, rng)


def configured_routing(
    config: GatewayConfig, tokenizer: Tokenizer | None = None
) -> tuple[RouterFactory, KvEventService | None]:
    """The router factory and KV-event service that ``spec.tokenizer_path`` and
    ``spec.kv_events`` describe. ``tokenizer`` replaces loading ``tokenizer_path`` (tests with the
    emulator's tokenizer). Raises ``ConfigError`` (naming ``spec.tokenizer_path``) if the
    tokenizer cannot be loaded."""
    spec = config.spec
    if tokenizer is None and spec.tokenizer_path is not None:
        tokenizer = HfChatTokenizer.from_dir(spec.tokenizer_path)
    model = spec.kv_events_model()
    if spec.kv_events is not None and model is not None:
        service = KvEventService(spec.kv_events, model)
        return service.router_factory(tokenizer), service
    bound = tokenizer

    def factory(routing: RoutingConfig, rng: random.Random) -> RouterLike:
        return Router(routing, rng, bound)

    return factory, None


def create_app(
    config: GatewayConfig,
    *,
    config_path: Path | None = None,
    router_factory: RouterFactory | None = None,
    tokenizer: Tokenizer | None = None,
) -> web.Application:
    """The gateway app. Its lifespan (``cleanup_ctx``) owns the upstream sessions, the health
    monitor, the discovery watcher and (with ``spec.kv_events``) the KV-event subscriber;
    ``app[GATEWAY_KEY]`` is the runtime (state, metrics, ``reload()``, ``kv_events``). Raises
    ``ConfigError`` if a variant's routing config cannot build a router. ``router_factory``
    (tests) replaces the one built from the config."""
    kv_events: KvEventService | None = None
    if router_factory is None:
        router_factory, kv_events = configured_routing(config, tokenizer)
    gateway = Gateway(config, router_factory, config_path, kv_events)
    app = web.Application(client_max_size=config.spec.limits.max_body_bytes)
    app[GATEWAY_KEY] = gateway
    handlers = Handlers(gateway)
    add_public_routes(app, handlers)
    add_admin_routes(app, gateway)
    app.router.add_get(
        "/admin/v1/kv-events", AdminApi(gateway).guard(_kv_events_state), allow_head=False
    )
    app.router.add_route("*", "/{tail:.*}", handlers.not_found)
    app.cleanup_ctx.append(_lifespan)
    return app


async def _kv_events_state(request: web.Request) -> web.StreamResponse:
    """``GET /admin/v1/kv-events``: per-instance mode (exact/approximate), causes, counters."""
    service = request.app[GATEWAY_KEY].kv_events
    if service is None:
        return web.json_response({"enabled": False})
    return web.json_response({"enabled": True, **service.describe()})


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY_KEY]
    await gateway.start()
    try:
        yield
    finally:
        await gateway.stop()


__all__ = ["GATEWAY_KEY", "configured_routing", "create_app", "default_router_factory"]
