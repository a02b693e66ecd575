"""``ListWatch``: one resource's objects kept in step with the API server.

List (the authoritative set, and its ``resourceVersion``), report, then watch from that version
and report after every change. A watch that ends (its ``timeoutSeconds``, or a client-side
deadline for a server that never ends it) or expires (a 410 ERROR event) leads to a new list at
once, unless it ended within ``min_watch_s`` of its start (a proxy closing it, a server answering
an empty 200 or 410 Gone every time): that is an error (``WatchEndedEarly``), so the next list
waits, instead of a loop of lists with no pause. Any error is passed to ``on_error`` (``first``:
the first of a streak) and the loop retries after a backoff (``access.api_loop``: from
``retry_interval_s``, doubling, capped, jittered); the last reported set stands meanwhile. Every
call has a timeout; the token is re-read at every list. An event is at most ``max_event_bytes``
(aiohttp's own line limit, 128 or 512 KiB by version, is too small for a large object). Objects
``keep`` rejects (checked here as well: not every API server or emulator applies selectors) are
not part of the set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.kube.access import KubeAccess, KubeAccessError, api_loop, json_or_raise

Obj = dict[str, Any]
_GONE = 410
_RETRIED = (KubeAccessError, aiohttp.ClientError, TimeoutError, ValueError)
MAX_EVENT_BYTES = 8 << 20  # an object is at most 1.5 MiB in etcd by default; room to spare


class WatchEndedEarly(KubeAccessError):
    """A watch ended, without an error or with 410 Gone, sooner than it should have."""


async def event_lines(content: aiohttp.StreamReader, limit: int) -> AsyncGenerator[bytes, None]:
    """The lines of a watch stream; ``KubeAccessError`` for a line over ``limit`` bytes."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        scanned, start = len(buffer), 0
        buffer += chunk
        while (end := buffer.find(b"\n", scanned)) >= 0 and end - start <= limit:
            yield bytes(buffer[start:end])
            start = scanned = end + 1
        del buffer[:start]
        if len(buffer) > limit:  # a line too long, complete or not
            raise KubeAccessError(f"a watch event over {limit} bytes")
    if buffer:
        yield bytes(buffer)


def object_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


class ListWatch:
    def __init__(
        self,
        spec: KubeApiSpec,
        path: Callable[[], str],
        *,
        on_change: Callable[[Mapping[str, Obj]], None],
        on_error: Callable[[BaseException, bool], None],
        keep: Callable[[Obj], bool] = lambda _obj: True,
        selectors: Mapping[str, str] | None = None,
        watch_timeout_s: float = 300.0,
        retry_interval_s: float = 2.0,
        min_watch_s: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        """``path``: the collection's API path (called at every list: it may read files).
        ``selectors``: ``labelSelector`` / ``fieldSelector`` query parameters. A watch shorter
        than ``min_watch_s`` (default: ``retry_interval_s``, at most half ``watch_timeout_s``)
        is an error. ``sleep``, ``clock``, ``rng`` (the backoff's jitter): injected by tests."""
        self.spec = spec
        self.access = KubeAccess(spec)
        self.path = path
        self.on_change = on_change
        self.on_error = on_error
        self.keep = keep
        self.selectors = dict(selectors or {})
        self.watch_timeout_s = watch_timeout_s
        self.retry_interval_s = retry_interval_s
        self.min_watch_s = (
            min(retry_interval_s, watch_timeout_s / 2) if min_watch_s is None else min_watch_s
        )
        self.max_event_bytes = MAX_EVENT_BYTES
        self.sleep = sleep
        self.clock = clock
        self.rng = rng or random.Random()
        self.objects: dict[str, Obj] = {}

    async def run(self) -> None:
        await api_loop(
            self.access,
            self.list_and_watch,
            self.on_error,
            retried=_RETRIED,
            retry_interval_s=self.retry_interval_s,
            sleep=self.sleep,
            rng=self.rng,
        )

    async def list_and_watch(self, http: aiohttp.ClientSession) -> None:
        url = self.access.api_server() + self.path()
        params = dict(self.selectors)
        timeout = self.access.timeout()
        headers = self.access.auth_headers()
        async with http.get(url, params=params, headers=headers, timeout=timeout) as resp:
            listing = await json_or_raise(resp)
        items = listing.get("items")
        if not isinstance(items, list):
            raise KubeAccessError(f"{url}: the list has no items")
        self.objects = {object_name(o): o for o in items if isinstance(o, dict) and self.keep(o)}
        self.on_change(self.objects)
        meta = listing.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        params.update(watch="true", allowWatchBookmarks="true")
        params["timeoutSeconds"] = str(max(1, round(self.watch_timeout_s)))
        if version:
            params["resourceVersion"] = str(version)
        started = self.clock()
        await self._watch(http, url, params)
        lasted = self.clock() - started
        if lasted < self.min_watch_s:
            raise WatchEndedEarly(
                f"{url}: the watch ended after {lasted:.1f} s, without an error or with 410 Gone"
                " (a proxy closing it?): listing again after a backoff"
            )

    async def _watch(self, http: aiohttp.ClientSession, url: str, params: dict[str, str]) -> None:
        watch_timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.spec.timeout_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.watch_timeout_s + self.spec.timeout_s):
                async with http.get(
                    url, params=params, headers=self.access.auth_headers(), timeout=watch_timeout
                ) as resp:
                    if resp.status != 200:
                        await json_or_raise(resp)
                    lines = event_lines(resp.content, self.max_event_bytes)
                    async with contextlib.aclosing(lines):
                        async for line in lines:
                            event = json.loads(line) if line.strip() else None
                            if isinstance(event, dict) and not self.event(event):
                                return

    def event(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; ``False``: the watch must restart from a new list."""
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            return True  # nothing to apply
        if kind == "ERROR":
            code = obj.get("code")
            if code == _GONE:
                return False
            raise KubeAccessError(f"watch error {code}: {obj.get('message', '')}")
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return True  # BOOKMARK
        name = object_name(obj)
        if kind == "DELETED" or not self.keep(obj):
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        self.on_change(self.objects)
        return True
