"""Who may change the node agent's cache over its HTTP API.

Mutating routes (every method but GET, HEAD and OPTIONS: ``POST /v1/prefetch``, the ref routes,
an embedding's own routes) need ``Authorization: Bearer <token>`` when a token is configured
(``status.token_env``, default ``$WARMFLEET_AGENT_TOKEN``, else the first line of
``status.token_file``); it is compared in constant time (``hmac.compare_digest``). Without a
token they are allowed only when the agent listens on a loopback address (``127.0.0.0/8``,
``::1``, ``localhost``) and refused (403) otherwise. Read-only routes (status, artifacts,
metrics, health) stay open.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from warmfleet.cache.config import StatusSpec
from warmfleet.core.errors import ConfigError

log = logging.getLogger("warmfleet.agent")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_agent_token(spec: StatusSpec) -> str | None:
    token = os.environ.get(spec.token_env, "").strip()
    if token:
        return token
    if spec.token_file is None:
        return None
    try:
        lines = Path(spec.token_file).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"status.tokenFile: cannot read {spec.token_file}: {err}") from err
    token = lines[0].strip() if lines else ""
    if not token:
        raise ConfigError(f"status.tokenFile: {spec.token_file} is empty")
    return token


def bearer_matches(header: str, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time. A header with bytes that
    are not UTF-8 (aiohttp hands them over as lone surrogates) is a wrong token, not a 500."""
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode("utf-8", "surrogatepass"), token.encode()
    )


@dataclass(frozen=True)
class ApiAuth:
    token: str | None
    host: str
    token_env: str = "WARMFLEET_AGENT_TOKEN"

    @classmethod
    def from_spec(cls, spec: StatusSpec) -> ApiAuth:
        return cls(read_agent_token(spec), spec.host, spec.token_env)

    @property
    def mutations_open(self) -> bool:
        """No token, but only this machine can reach the API."""
        return self.token is None and is_loopback(self.host)

    def refusal(self, request: web.Request) -> web.Response | None:
        """The answer to a request it may not make (None: let it through)."""
        if request.method in SAFE_METHODS or self.mutations_open:
            return None
        if self.token is None:
            return web.json_response(
                {
                    "error": f"the agent listens on {self.host} and no token is configured "
                    "(status.tokenEnv / status.tokenFile): changes over HTTP are refused"
                },
                status=403,
            )
        if bearer_matches(request.headers.get("Authorization", ""), self.token):
            return None
        return web.json_response(
            {"error": "a valid 'Authorization: Bearer <token>' is required"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="warmfleet-agent"'},
        )

    def middleware(self) -> Middleware:
        if self.token is None and not self.mutations_open:
            log.warning(
                "status API on %s without a token: mutating routes are refused "
                "(set $%s or status.tokenFile)",
                self.host,
                self.token_env,
            )

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            refused = self.refusal(request)
            return refused if refused is not None else await handler(request)

        return guard
