"""Reaching the API server as ``KubeApiSpec`` says: its URL, the bearer token (re-read on every
call: projected service-account tokens rotate) and TLS trust; in a pod from the service account,
outside one from a kubeconfig file (its current context, or ``context``). ``api_loop`` calls the
server forever, retrying errors after a capped, jittered backoff (``Backoff``)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from warmfleet.core.config import load_yaml_text
from warmfleet.core.errors import ConfigError, WarmfleetError
from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.core.kubeconfig import KubeContext, kube_context
from warmfleet.kube.endpointslices import served_versions

RETRY_CAP_S = 30.0  # the longest wait between retries (before jitter), unless the first is longer
JITTER = 0.25  # each wait is stretched by up to this fraction, at random


class KubeAccessError(WarmfleetError):
    """The API server cannot be located or answered with an error."""


class KubeAccess:
    """How one component reaches the API server ``spec`` locates: its URL, credentials and TLS
    trust. Owns the parsed kubeconfig (parsed again when the file changes), so build one per
    component and keep it."""

    def __init__(self, spec: KubeApiSpec) -> None:
        self.spec = spec
        self._kubeconfig: tuple[int, KubeContext] | None = None  # (mtime_ns, context)

    def kubeconfig_context(self) -> KubeContext | None:
        """The context ``spec.kubeconfig`` names (``None`` without a kubeconfig).
        ``KubeAccessError`` if it cannot be read or used."""
        spec = self.spec
        if spec.kubeconfig is None:
            return None
        path = Path(spec.kubeconfig).expanduser()
        try:
            mtime = path.stat().st_mtime_ns
            if self._kubeconfig is not None and self._kubeconfig[0] == mtime:
                return self._kubeconfig[1]
            data = load_yaml_text(path.read_text(encoding="utf-8"), str(path))
            context = kube_context(data, str(path), path.parent, spec.context)
        except (OSError, UnicodeDecodeError) as err:
            raise KubeAccessError(f"kubeconfig {path}: cannot read: {err}") from err
        except ConfigError as err:
            raise KubeAccessError(str(err)) from err
        self._kubeconfig = (mtime, context)
        return context

    def api_server(self) -> str:
        if self.spec.api_server is not None:
            return self.spec.api_server
        context = self.kubeconfig_context()
        if context is not None:
            return context.server
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeAccessError(
                "apiServer is not set and $KUBERNETES_SERVICE_HOST is unset (not in a pod)"
            )
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def bearer_token(self) -> str | None:
        """The bearer token as it is now: the kubeconfig context's (inline, or its token
        file), else ``token_path``'s; ``None`` if there is none."""
        context = self.kubeconfig_context()
        if context is None:
            return read_token(self.spec.token_path)
        return context.token or (read_token(context.token_path) if context.token_path else None)

    def auth_headers(self) -> dict[str, str]:
        """``Authorization: Bearer <token>`` when there is a token, else none."""
        token = self.bearer_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def tls(self) -> ssl.SSLContext | bool:
        """With a kubeconfig, its context's CA (data or file; no verification if it says
        ``insecure-skip-tls-verify``); else the cluster CA when its file exists; else the
        system's trust store (``True``). ``KubeAccessError`` if the CA cannot be used."""
        context = self.kubeconfig_context()
        if context is not None and context.insecure:
            return False
        try:
            if context is None:
                ca_path = self.spec.ca_path
                return (
                    ssl.create_default_context(cafile=ca_path) if Path(ca_path).exists() else True
                )
            if context.ca_pem is not None:
                return ssl.create_default_context(cadata=context.ca_pem)
            if context.ca_path is not None:
                return ssl.create_default_context(cafile=context.ca_path)
        except (OSError, ssl.SSLError) as err:
            where = self.spec.ca_path if context is None else f"kubeconfig {self.spec.kubeconfig}"
            raise KubeAccessError(f"{where}: the cluster CA: {err}") from err
        return True

    def session(self) -> aiohttp.ClientSession:
        """A client session that trusts the API server as ``tls`` says."""
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.tls()))

    def timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.spec.timeout_s)


def read_token(path: str) -> str | None:
    """A bearer token file as it is now (the kubelet rotates projected service-account tokens,
    so callers read it for every request); ``None`` if it is missing or empty."""
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


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


async def served_versions_of(
    http: aiohttp.ClientSession, access: KubeAccess, group: str
) -> list[str]:
    """The versions of API ``group`` the server serves (API discovery), preferred first."""
    url = f"{access.api_server()}/apis/{group}"
    headers = access.auth_headers()
    async with http.get(url, headers=headers, timeout=access.timeout()) as resp:
        return served_versions(await json_or_raise(resp))


class Backoff:
    """The waits between the retries of one streak of errors: ``first_s``, doubling up to
    ``cap_s`` (never below ``first_s``), each stretched by up to ``JITTER`` at random (``rng``:
    seeded in tests) so that clients failing together do not retry in step. ``reset`` when a
    call succeeds; ``failures``: the streak so far."""

    def __init__(self, first_s: float, cap_s: float, rng: random.Random) -> None:
        self.first_s = first_s
        self.cap_s = max(cap_s, first_s)
        self.rng = rng
        self.failures = 0

    def next(self) -> float:
        base = min(self.cap_s, self.first_s * 2.0 ** min(self.failures, 30))
        self.failures += 1
        return base * (1.0 + JITTER * self.rng.random())

    def reset(self) -> None:
        self.failures = 0


async def api_loop(
    access: KubeAccess,
    step: Callable[[aiohttp.ClientSession], Awaitable[None]],
    on_error: Callable[[BaseException, bool], None],
    *,
    retried: tuple[type[BaseException], ...],
    retry_interval_s: float,
    interval_s: float = 0.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> None:
    """Run ``step`` forever on a session to the API server, ``interval_s`` after a success.
    An error in ``retried`` (opening the session included: a kubeconfig or CA that cannot be
    used) is passed to ``on_error`` (with ``first``: the first of a streak) and retried after
    ``Backoff(retry_interval_s, RETRY_CAP_S)``, on a new session (its TLS trust read again).
    Anything else is a bug and ends the loop. ``sleep`` and ``rng``: injected by tests."""
    backoff = Backoff(retry_interval_s, RETRY_CAP_S, rng or random.Random())
    while True:
        try:
            async with access.session() as http:
                while True:
                    await step(http)
                    backoff.reset()
                    await sleep(interval_s)
        except retried as err:
            on_error(err, backoff.failures == 0)
            await sleep(backoff.next())
