"""``GET /v1/models``: the union of the default endpoint's backends, cached for a TTL.

A variant that lists its ``models`` in the config is advertised with exactly those (requests for
other models would get 404 anyway); a variant serving any model advertises what its healthy
instances report. Concurrent callers share one refresh (a lock, no extra task).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout

from warmfleet.gateway.fleet import GatewayState
from warmfleet.gateway.state import VariantRuntime

log = logging.getLogger(__name__)


class ModelsCache:
    def __init__(self, state: GatewayState, session: ClientSession) -> None:
        self.state = state
        self.session = session
        self._body: bytes | None = None
        self._expires_s = 0.0
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._body = None

    async def get(self) -> bytes:
        if self._body is not None and time.monotonic() < self._expires_s:
            return self._body
        async with self._lock:
            if self._body is not None and time.monotonic() < self._expires_s:
                return self._body
            entries = await self._collect()
            body = json.dumps({"object": "list", "data": entries}).encode()
            self._body = body
            self._expires_s = time.monotonic() + self.state.spec.models_cache_ttl_s
            return body

    async def _collect(self) -> list[dict[str, Any]]:
        variants = [v for e in self.state.openai_endpoints() for v in e.variants.values()]
        reported = await asyncio.gather(*(self._variant_models(v) for v in variants))
        merged: dict[str, dict[str, Any]] = {}
        for variant, found in zip(variants, reported, strict=True):
            by_id = {e["id"]: e for e in found}
            names = variant.config.models or list(by_id)
            for name in names:
                merged.setdefault(name, by_id.get(name) or _entry(name))
        return list(merged.values())

    async def _variant_models(self, variant: VariantRuntime) -> list[dict[str, Any]]:
        timeout = ClientTimeout(total=self.state.health.timeout_s)
        results = await asyncio.gather(
            *(self._fetch(i.base_url + "/v1/models", timeout) for i in variant.healthy)
        )
        out: list[dict[str, Any]] = []
        for entries in results:
            out.extend(entries)
        return out

    async def _fetch(self, url: str, timeout: ClientTimeout) -> list[dict[str, Any]]:
        try:
            async with self.session.get(url, timeout=timeout) as resp:
                if resp.status != 200:
                    return []
                payload = json.loads(await resp.read())
        except (ClientError, TimeoutError, OSError, ValueError) as err:
            log.debug("models from %s failed: %r", url, err)
            return []
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            return []
        return [e for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)]


def _entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "warmfleet"}
