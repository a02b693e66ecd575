"""App factory: ``create_app(config)`` builds one gateway: its runtime, routes and HTTP server."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from warmfleet.core.errors import ConfigError
from warmfleet.gateway.admin import AdminApi, add_admin_routes
from warmfleet.gateway.config import GatewayConfig
from warmfleet.gateway.errors import plain_error
from warmfleet.gateway.http.access_log import AccessLog
from warmfleet.gateway.http.listener import HttpServer
from warmfleet.gateway.http.messages import ErrorFactory, Request, Response, ServerLimits
from warmfleet.gateway.http.routes import Routes
from warmfleet.gateway.kv_events.service import KvEventService
from warmfleet.gateway.openai.handlers import Handlers, add_public_routes
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.gateway.variant import RouterFactory, RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.keys import Tokenizer
from warmfleet.routing.router import Router


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
        try:
            tokenizer = HfChatTokenizer.from_dir(spec.tokenizer_path)
        except ConfigError as err:
            raise ConfigError(f"spec.tokenizerPath: {err}") from err
    model = spec.kv_events_model()
    if spec.kv_events is not None and model is not None:
        service = KvEventService(spec.kv_events, model)
        return service.router_factory(tokenizer), service
    bound = tokenizer

    def factory(routing: RoutingConfig, rng: random.Random) -> RouterLike:
        return Router(routing, rng, bound)

    return factory, None


class GatewayApp:
    """One gateway: ``gateway`` (the runtime: state, metrics, ``reload()``, ``kv_events``) and
    the HTTP server in front of it. ``start_app`` (``server.py``) runs it."""

    def __init__(self, gateway: Gateway, routes: Routes, error: ErrorFactory) -> None:
        self.gateway = gateway
        self.routes = routes
        limits = gateway.state.limits
        self.server = HttpServer(
            routes.dispatch,
            ServerLimits(limits.max_body_bytes, limits.body_read_timeout_s),
            error,
            gateway.base_config.spec.listen.max_connections,
        )
        self._apply_spec(gateway.base_config)
        gateway.on_applied.append(self._apply_spec)

    def _apply_spec(self, config: GatewayConfig) -> None:
        """The HTTP server's part of a (re)loaded config: limits and the access log."""
        limits = config.spec.limits
        self.server.set_limits(
            limits.max_body_bytes, limits.body_read_timeout_s, limits.max_buffered_body_bytes
        )
        access = self.server.access_log
        if config.spec.access_log != (access is not None):
            self.server.access_log = AccessLog() if config.spec.access_log else None


def _counted_errors(gateway: Gateway) -> ErrorFactory:
    """Errors of the HTTP layer itself (malformed, too large, too slow, no route): the OpenAI
    envelope, counted in ``rejected_requests_total``."""

    def error(status: int, message: str) -> Response:
        gateway.metrics.rejected.labels(str(status)).inc()
        return plain_error(status, message)

    return error


def create_app(
    config: GatewayConfig,
    *,
    config_path: Path | None = None,
    router_factory: RouterFactory | None = None,
    tokenizer: Tokenizer | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> GatewayApp:
    """The gateway app (not yet started: ``start_app`` starts the runtime, which owns the
    upstream pool, the health monitor, the discovery watcher and, with ``spec.kv_events``, the
    KV-event subscriber). Raises ``ConfigError`` if a variant's routing config cannot build a
    router. ``router_factory`` (tests) replaces the one built from the config; ``clock`` (tests)
    times passive ejections."""
    kv_events: KvEventService | None = None
    if router_factory is None:
        router_factory, kv_events = configured_routing(config, tokenizer)
    gateway = Gateway(config, router_factory, config_path, kv_events, clock)
    error = _counted_errors(gateway)
    routes = Routes(error)
    add_public_routes(routes, Handlers(gateway))
    admin = AdminApi(gateway)
    add_admin_routes(routes, admin)

    async def kv_events_state(_request: Request) -> Response:
        """``GET /admin/v1/kv-events``: per-instance mode (exact/approximate), causes, counters."""
        service = gateway.kv_events
        body = {"enabled": False} if service is None else {"enabled": True, **service.describe()}
        return Response(200, json.dumps(body).encode())

    routes.add("GET", "/admin/v1/kv-events", admin.guard(kv_events_state))

    async def replica_sync_state(_request: Request) -> Response:
        """``GET /admin/v1/replica-sync``: peers, catch-up, open requests per origin."""
        sync = gateway.replica_sync
        body = {"enabled": False} if sync is None else {"enabled": True, **sync.describe()}
        return Response(200, json.dumps(body).encode())

    routes.add("GET", "/admin/v1/replica-sync", admin.guard(replica_sync_state))
    return GatewayApp(gateway, routes, error)


__all__ = ["GatewayApp", "configured_routing", "create_app", "default_router_factory"]
