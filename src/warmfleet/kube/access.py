"""Reaching the API server as ``KubeApiSpec`` says: its URL, the bearer token (re-read on every
call: projected service-account tokens rotate) and TLS trust."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.core.errors import WarmfleetError
from warmfleet.core.kubeapi import KubeApiSpec


class KubeAccessError(WarmfleetError):
    """The API server cannot be located or answered with an error."""


def api_server(spec: KubeApiSpec) -> str:
    if spec.api_server is not None:
        return spec.api_server
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeAccessError(
            "api_server is not set and $KUBERNETES_SERVICE_HOST is unset (not in a pod)"
        )
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def read_token(path: str) -> str | None:
    """A bearer token file as it is now (the kubelet rotates projected service-account tokens,
    so callers read it for every request); ``None`` if it is missing or empty."""
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def auth_headers(spec: KubeApiSpec) -> dict[str, str]:
    """``Authorization: Bearer <token>`` when the token file exists, else none."""
    token = read_token(spec.token_path)
    return {"Authorization": f"Bearer {token}"} if token else {}


def tls(spec: KubeApiSpec) -> ssl.SSLContext | bool:
    """The cluster CA when its file exists, else the system's trust store (``True``)."""
    return ssl.create_default_context(cafile=spec.ca_path) if Path(spec.ca_path).exists() else True


def read_own(path: str, what: str) -> str:
    """A value the pod learns from a file (its namespace from the service account)."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise KubeAccessError(f"{what} is not set and {path} is unreadable: {err}") from err
    if not value:
        raise KubeAccessError(f"{what} is not set and {path} is empty")
    return value


async def json_or_raise(resp: aiohttp.ClientResponse) -> dict[str, Any]:
    """The body of a 200 answer as a JSON object; ``KubeAccessError`` for anything else."""
    text = await resp.text()
    if resp.status != 200:
        raise KubeAccessError(f"{resp.method} {resp.url.path}: HTTP {resp.status}: {text[:200]}")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise KubeAccessError(f"{resp.url.path}: not a JSON object")
    return data


async def api_loop(
    spec: KubeApiSpec,
    step: Callable[[aiohttp.ClientSession], Awaitable[None]],
    on_error: Callable[[BaseException, bool], None],
    *,
    retried: tuple[type[BaseException], ...],
    retry_interval_s: float,
    interval_s: float = 0.0,
) -> None:
    """Run ``step`` forever on one session to the API server: ``interval_s`` after a success,
    ``retry_interval_s`` after an error in ``retried`` (passed to ``on_error`` with ``first``:
    the first of a streak). Anything else is a bug and ends the loop."""
    failing = False
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls(spec))) as http:
        while True:
            try:
                await step(http)
                failing, delay_s = False, interval_s
            except retried as err:
                on_error(err, not failing)
                failing, delay_s = True, retry_interval_s
            await asyncio.sleep(delay_s)
