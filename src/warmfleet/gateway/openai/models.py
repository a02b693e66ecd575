"""``GET /v1/models``: the union of the default endpoint's backends, cached for a TTL.

A variant that lists its ``models`` in the config is advertised with exactly those (requests for
other models would get 404 anyway); a variant serving any model advertises what its healthy
instances report. Concurrent callers share one refresh (a lock, no extra task). A bad answer
is counted in ``models_answers_dropped_total{instance_id,reason}`` (``GatewayMetrics``; its
series go once no variant has the id: ``gateway.departures``).

The instances are asked on the cache's own connection pool, each read timed from when it has
its slot (``gateway.probes``): instances whose ``/v1/models`` hangs delay a refresh by their
timeout but never leave the others' models out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import orjson
from aiohttp import ClientError, ClientResponse, ClientSession

from warmfleet.core.jsonio import deepest_field
from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.probes import Prober
from warmfleet.gateway.variant import VariantRuntime
from warmfleet.gateway.world import GatewayState

log = logging.getLogger(__name__)

# An instance's /v1/models answer: a few KB (hundreds of LoRA adapters: ~100 KB).
MAX_ANSWER_BYTES = 4 << 20
# Levels of an entry (the entry is level 1); merged entries are re-serialized as they came.
MAX_ANSWER_DEPTH = 32


class ModelsCache:
    def __init__(self, state: GatewayState, session: ClientSession) -> None:
        self.state = state
        self.session = session
        self._prober = Prober(session)
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

    async def card(self, model: str) -> bytes | None:
        """``GET /v1/models/{model}``: that model's entry in the union, or ``None``."""
        for entry in json.loads(await self.get())["data"]:
            if entry.get("id") == model:
                return json.dumps(entry).encode()
        return None

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
        timeout_s = self.state.health.timeout_s
        results = await asyncio.gather(*(self._fetch(i, timeout_s) for i in variant.healthy))
        out: list[dict[str, Any]] = []
        for entries in results:
            out.extend(entries)
        return out

    async def _fetch(self, inst: InstanceRuntime, timeout_s: float) -> list[dict[str, Any]]:
        """The instance's model entries; none if it is unreachable, answers an error, or its
        answer is malformed, over ``MAX_ANSWER_BYTES`` or nested deeper than
        ``MAX_ANSWER_DEPTH`` (those three are logged and counted): one instance's answer can
        only drop its own models, never fail the list."""
        url = inst.base_url + "/v1/models"
        try:
            async with self._prober.get(url, timeout_s) as resp:
                if resp.status != 200:
                    return []
                raw = await _read_capped(resp, MAX_ANSWER_BYTES)
        except (ClientError, TimeoutError, OSError) as err:
            log.debug("models from %s failed: %r", url, err)
            return []
        except _TooLargeError:
            return self._dropped(inst, url, "too_large")
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self._dropped(inst, url, "malformed")
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            return self._dropped(inst, url, "malformed")
        entries = [e for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)]
        if any(deepest_field(e, MAX_ANSWER_DEPTH) is not None for e in entries):
            return self._dropped(inst, url, "too_deep")
        return entries

    def _dropped(self, inst: InstanceRuntime, url: str, reason: str) -> list[dict[str, Any]]:
        """Log and count a bad answer; one read after its instance left its variant is not
        counted (that id's series may have gone: ``gateway.departures``)."""
        log.warning("models from %s (%s) left out: answer %s", url, inst.instance_id, reason)
        if not inst.removed:
            self.state.metrics.models_dropped.labels(inst.instance_id, reason).inc()
        return []


class _TooLargeError(Exception):
    """An answer over the cap (internal to this module: becomes a dropped answer)."""


async def _read_capped(resp: ClientResponse, cap_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 << 10):
        size += len(chunk)
        if size > cap_bytes:
            raise _TooLargeError
        chunks.append(chunk)
    return b"".join(chunks)


def _entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "warmfleet"}
