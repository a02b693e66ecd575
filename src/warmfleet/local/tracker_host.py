"""The embedded fleet's peer tracker over HTTP (127.0.0.1, the fleet's agent token).

``POST /v1/tracker/{key}/plan`` takes a filling node's report and wish (``warmfleet.agent.
peer_fill`` speaks it; a serving node's renewal or leave too, ``warmfleet.agent.peer_presence``)
and answers ``warmfleet.control.tracker.Tracker.plan``'s assignments;
``GET /v1/tracker`` shows every version's piece holders and counts. When ``spec.peers`` is not
enabled nothing is started and the agents fill from the origin as before.
"""

from __future__ import annotations

import hmac
import random
from typing import Any

from aiohttp import web

from warmfleet.control.tracker import (
    PlanRequest,
    Tracker,
    TrackerOptions,
    listed_hashes,
    listed_pieces,
)
from warmfleet.core.clock import MonotonicClock
from warmfleet.core.errors import BadRequestError
from warmfleet.local.config import PeersConfig


def parse_request(body: Any) -> tuple[int, PlanRequest]:
    """The JSON body -> (piece count, request); BadRequestError names what is wrong."""
    if not isinstance(body, dict):
        raise BadRequestError("body must be a JSON object")
    try:
        pieces = int(body["pieces"])
        req = PlanRequest(
            node=str(body["node"]),
            url=str(body["url"]),
            session=str(body["session"]),
            have=tuple(int(p) for p in body.get("have") or ()),
            hashes=tuple((int(k), str(v)) for k, v in (body.get("hashes") or {}).items()),
            failed_peers=tuple(str(p) for p in body.get("failedPeers") or ()),
            released=tuple(int(p) for p in body.get("released") or ()),
            want=max(0, min(int(body.get("want") or 0), 64)),
            withdrawn=listed_pieces(body, "withdrawn"),
            withdrawn_hashes=listed_hashes(body, "withdrawnHashes"),
            fetching=listed_pieces(body, "fetching"),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise BadRequestError(f"bad plan request: {err!r}") from err
    if pieces < 0:
        raise BadRequestError("pieces must be >= 0")
    return pieces, req


class TrackerHost:
    def __init__(self, config: PeersConfig, token: str, seed: int = 0) -> None:
        self.config = config
        self._token = token
        options = TrackerOptions(
            origin_fetches=config.origin_fetches,
            max_uploads_per_peer=config.max_uploads_per_peer,
            origin_streams=config.origin_streams,
            stall_s=config.tracker_stall_s,
        )
        self.tracker = Tracker(MonotonicClock(), random.Random(seed), options)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        if not self.config.enabled or self._runner is not None:
            return
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self.url = ""

    def assignment_extra(self, node: str, agent_url: str) -> dict[str, Any]:
        """What an agent's ``PUT /v1/fleet/assignments`` carries about peers (or nothing)."""
        if self._runner is None:
            return {}
        c = self.config
        peers = {"tracker": self.url, "node": node, "url": agent_url, "pieceBytes": c.piece_bytes,
                 "serveBps": c.serve_bps, "stallS": c.stall_s, "renewS": c.renew_s}  # fmt: skip
        return {"peers": peers}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/tracker/{key}/plan", self._plan)
        app.router.add_get("/v1/tracker", self._show)
        return app

    def _authorised(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self._token.encode()
        )

    async def _plan(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "the fleet's bearer token is required"}, status=401)
        try:
            pieces, req = parse_request(await request.json())
            plan = self.tracker.plan(request.match_info["key"], pieces, req)
        except ValueError as err:  # not JSON
            return web.json_response({"error": f"body is not JSON: {err}"}, status=400)
        except BadRequestError as err:
            return web.json_response({"error": str(err)}, status=400)
        return web.json_response(
            {
                "assignments": [
                    {"piece": a.piece, "peer": a.peer, "url": a.url} for a in plan.assignments
                ],
                "hashes": {str(k): v for k, v in plan.hashes.items()},
                "complete": plan.complete,
            }
        )

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, v in self.tracker.versions.items():
            stats = v.stats()
            out[key] = {
                "pieces": v.pieces,
                "nodes": {n: len(node.have) for n, node in v.nodes.items()},
                "originAssignments": stats.origin_assignments,
                "originFallbacks": stats.origin_fallbacks,
                "peerAssignments": stats.peer_assignments,
                "released": stats.released,
            }
        return out

    async def _show(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.json_response({"error": "the fleet's bearer token is required"}, status=401)
        return web.json_response({"versions": self.snapshot()})
