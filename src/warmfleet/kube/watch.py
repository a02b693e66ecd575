"""``ListWatch``: one resource's objects kept in step with the API server.

List (the authoritative set, and its ``resourceVersion``), report, then watch from that version
and report after every change. A watch that ends (its ``timeoutSeconds``, or a client-side
deadline for a server that never ends it) or expires (a 410 ERROR event) leads to a new list.
Any error is passed to ``on_error`` (``first``: the first of a streak) and the loop retries
after ``retry_interval_s``; the last reported set stands meanwhile. Every call has a timeout;
the token is re-read at every list. Objects ``keep`` rejects (checked here as well: not every
API server or emulator applies selectors) are not part of the set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.kube.access import KubeAccess, KubeAccessError, api_loop, json_or_raise

Obj = dict[str, Any]
_GONE = 410
_RETRIED = (KubeAccessError, aiohttp.ClientError, TimeoutError, ValueError)


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
    ) -> None:
        """``path``: the collection's API path (called at every list: it may read files).
        ``selectors``: ``labelSelector`` / ``fieldSelector`` query parameters."""
        self.spec = spec
        self.access = KubeAccess(spec)
        self.path = path
        self.on_change = on_change
        self.on_error = on_error
        self.keep = keep
        self.selectors = dict(selectors or {})
        self.watch_timeout_s = watch_timeout_s
        self.retry_interval_s = retry_interval_s
        self.objects: dict[str, Obj] = {}

    async def run(self) -> None:
        await api_loop(
            self.access,
            self.list_and_watch,
            self.on_error,
            retried=_RETRIED,
            retry_interval_s=self.retry_interval_s,
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
        await self._watch(http, url, params)

    async def _watch(self, http: aiohttp.ClientSession, url: str, params: dict[str, str]) -> None:
        watch_timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.spec.timeout_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.watch_timeout_s + self.spec.timeout_s):
                async with http.get(
                    url, params=params, headers=self.access.auth_headers(), timeout=watch_timeout
                ) as resp:
                    if resp.status != 200:
                        await json_or_raise(resp)
                    async for line in resp.content:
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
