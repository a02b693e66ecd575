"""App factory: ``create_app(config)`` builds the aiohttp application of one gateway."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from warmfleet.gateway.admin import add_admin_routes
from warmfleet.gateway.config import GatewayConfig
from warmfleet.gateway.handlers import Handlers, add_public_routes
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.state import RouterFactory, RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.router import Router

GATEWAY_KEY = web.AppKey("warmfleet_gateway", Gateway)


def default_router_factory(config: RoutingConfig, rng: random.Random) -> RouterLike:
    """The routing core's facade (no tokenizer: key modes text and bytes)."""
    return Router(config, rng)


def create_app(
    config: GatewayConfig,
    *,
    config_path: Path | None = None,
    router_factory: RouterFactory | None = None,
) -> web.Application:
    """The gateway app. Its lifespan (``cleanup_ctx``) owns the upstream sessions, the health
    monitor and the discovery watcher; ``app[GATEWAY_KEY]`` is the runtime (state, metrics,
    ``reload()``). Raises ``ConfigError`` if a variant's routing config cannot build a router."""
    gateway = Gateway(config, router_factory or default_router_factory, config_path)
    app = web.Application(client_max_size=config.spec.limits.max_body_bytes)
    app[GATEWAY_KEY] = gateway
    handlers = Handlers(gateway)
    add_public_routes(app, handlers)
    add_admin_routes(app, gateway)
    app.router.add_route("*", "/{tail:.*}", handlers.not_found)
    app.cleanup_ctx.append(_lifespan)
    return app


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY_KEY]
    await gateway.start()
    try:
        yield
    finally:
        await gateway.stop()


__all__ = ["GATEWAY_KEY", "create_app", "default_router_factory"]
