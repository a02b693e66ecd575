"""Small HTTP status API of the node agent (for the fleet controller).

``GET /healthz``, ``GET /v1/status`` (node capacity, every artifact, and as ``unadmitted`` the
configured or assigned ones whose prefetch failed before admission: ``failed`` with the reason,
no record), ``GET /v1/artifacts/{key}`` (key, unique prefix or name; an unadmitted one by
name), ``POST /v1/prefetch`` (``{"uri", "revision"?, "name"?, "holder"?, "pin"?}`` -> 202, runs
in the agent's task group), ``POST|DELETE /v1/artifacts/{key}/refs/{holder}`` and
``GET /metrics`` (Prometheus text format).
Mutating routes need the bearer token, or a loopback-only listener (``agent.api_auth``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from warmfleet.agent.api_auth import ApiAuth
from warmfleet.agent.manager import CacheManager
from warmfleet.cache.capacity import occupied_bytes
from warmfleet.core.errors import BadRequestError, NotFoundError, WarmfleetError
from warmfleet.core.jsonio import loads_body

Spawn = Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]]
MANAGER_KEY = web.AppKey("manager", CacheManager)
SPAWN_KEY: web.AppKey[Spawn] = web.AppKey("spawn")


def build_app(manager: CacheManager, spawn: Spawn, auth: ApiAuth | None = None) -> web.Application:
    """``auth`` defaults to the manager's ``status`` settings (token, listening host); it also
    guards the mutating routes an embedding adds to the app."""
    guard = (auth or ApiAuth.from_spec(manager.spec.status)).middleware()
    app = web.Application(middlewares=[guard, _errors])
    app[MANAGER_KEY] = manager
    app[SPAWN_KEY] = spawn
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/v1/artifacts/{key}", _artifact)
    app.router.add_post("/v1/prefetch", _prefetch)
    app.router.add_post("/v1/artifacts/{key}/refs/{holder}", _add_ref)
    app.router.add_delete("/v1/artifacts/{key}/refs/{holder}", _drop_ref)
    app.router.add_get("/metrics", _metrics)
    return app


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except NotFoundError as err:
        return web.json_response({"error": str(err)}, status=404)
    except BadRequestError as err:
        return web.json_response({"error": str(err)}, status=400)
    except WarmfleetError as err:
        return web.json_response({"error": str(err)}, status=409)


async def _healthz(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _status(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    records = await asyncio.to_thread(manager.records)
    statuses = await asyncio.to_thread(manager.statuses, records)
    by_key = {r.key: r for r in records}
    artifacts = []
    for status in statuses:
        rec = by_key[status.key]
        doc = status.to_json()
        doc.update(
            {
                "pinned": rec.pinned,
                "refs": sorted(rec.refs),
                "extra": rec.extra,
                "last_used_s": rec.last_used_s,
            }
        )
        artifacts.append(doc)
    policy = manager.policy
    node = {
        "root": str(manager.store.root),
        "budget_bytes": policy.budget_bytes,
        "reserve_bytes": policy.reserve_bytes,
        "high_watermark_bytes": policy.high_limit_bytes,
        "low_watermark_bytes": policy.low_limit_bytes,
        "used_bytes": occupied_bytes(records),
        "fs_free_bytes": manager.store.free_bytes(),
    }
    unadmitted = [f.to_json() for f in manager.failures.unadmitted()]
    return web.json_response({"node": node, "artifacts": artifacts, "unadmitted": unadmitted})


async def _artifact(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    wanted = request.match_info["key"]
    try:
        rec = manager.store.read_index().resolve(wanted)
    except NotFoundError:  # a configured or assigned artifact refused before admission?
        failed = [f for f in manager.failures.unadmitted() if f.name == wanted]
        if not failed:
            raise
        return web.json_response(failed[0].to_json())
    status = manager.status_of(rec.key)
    doc = status.to_json() if status else {}
    doc.update(rec.to_json())
    return web.json_response(doc)


async def _prefetch(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    body = loads_body(await request.read())  # BadRequestError (400), never RecursionError
    if not isinstance(body, dict) or not isinstance(body.get("uri"), str) or not body["uri"]:
        raise BadRequestError("body must be a JSON object with at least 'uri' (a string)")
    uri = body["uri"]
    for field in ("revision", "name", "holder"):
        if not isinstance(body.get(field), str | None):
            raise BadRequestError(f"'{field}' must be a string")
    pin = body.get("pin", False)
    if not isinstance(pin, bool):
        raise BadRequestError("'pin' must be true or false")
    coro = manager.prefetch(
        uri,
        revision=body.get("revision"),
        name=body.get("name"),
        holder=body.get("holder"),
        pin=pin,
    )
    request.app[SPAWN_KEY](coro)
    return web.json_response({"accepted": uri}, status=202)


async def _add_ref(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    rec = manager.add_ref(request.match_info["key"], request.match_info["holder"])
    return web.json_response(rec.to_json())


async def _drop_ref(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    rec = manager.drop_ref(request.match_info["key"], request.match_info["holder"])
    return web.json_response(rec.to_json())


async def _metrics(request: web.Request) -> web.Response:
    manager = request.app[MANAGER_KEY]
    return web.Response(
        body=manager.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
