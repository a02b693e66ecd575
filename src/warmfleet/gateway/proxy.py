"""The hot path: choose an instance, send the client's bytes unchanged, relay the answer.

- The body is forwarded as received (never re-serialized); the answer is relayed as it arrives
  (SSE events are written as soon as they are complete; a partial event is held only until its
  end arrives, so an error event can never be glued onto half an event).
- Retries go to another instance, and only before any byte reached the client.
- In-flight requests and tokens per instance are counted here and fed to the strategy.
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import NoReturn

from aiohttp import (
    ClientConnectionError,
    ClientConnectorError,
    ClientError,
    ClientPayloadError,
    ClientResponse,
    ClientSession,
    ConnectionTimeoutError,
    StreamReader,
    hdrs,
    web,
)
from multidict import istr

from warmfleet.core.errors import NoInstanceAvailableError, WarmfleetError
from warmfleet.core.types import Decision, RoutingKey
from warmfleet.gateway.errors import (
    INSTANCE_HEADER,
    REASON_HEADER,
    InternalError,
    UpstreamError,
    UpstreamTimeoutError,
    error_response,
    sse_error_event,
    status_and_type,
)
from warmfleet.gateway.fleet import GatewayState
from warmfleet.gateway.state import InstanceRuntime, RouterLike, VariantRuntime

log = logging.getLogger(__name__)

# istr names: multidict looks them up without case-folding the name on every call.
_X_REQUEST_ID = istr("X-Request-Id")
_PASS_REQUEST_HEADERS = (hdrs.AUTHORIZATION, _X_REQUEST_ID)
_PASS_RESPONSE_HEADERS = (hdrs.CONTENT_ENCODING, _X_REQUEST_ID)
_MAX_HELD_EVENT_BYTES = 1 << 20


class SseFramer:
    """Splits a relayed byte stream at SSE event boundaries (a blank line)."""

    __slots__ = ("tail",)

    def __init__(self) -> None:
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes that complete whole events; the rest is held for the next chunk."""
        if self.tail:
            chunk = self.tail + chunk
            self.tail = b""
        if chunk.endswith((b"\n\n", b"\r\n\r\n")):
            return chunk
        lf = chunk.rfind(b"\n\n")
        crlf = chunk.rfind(b"\r\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
        if len(chunk) - cut > _MAX_HELD_EVENT_BYTES:
            return chunk  # a giant event: stop holding, relay as is
        self.tail = chunk[cut:]
        return chunk[:cut]

    def flush(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


class _Retry(Exception):
    """An attempt failed before any byte reached the client; try another instance."""

    def __init__(self, cause: WarmfleetError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Attempt:
    """One try of one request on one instance."""

    __slots__ = ("decision", "inst", "request", "t_start", "variant")

    def __init__(
        self,
        request: web.Request,
        variant: VariantRuntime,
        inst: InstanceRuntime,
        decision: Decision,
        t_start: float,
    ) -> None:
        self.request = request
        self.variant = variant
        self.inst = inst
        self.decision = decision
        self.t_start = t_start

    def count(self, status: str) -> None:
        self.variant.request_counter(self.inst.instance_id, self.decision.reason, status).inc()

    def timeout(self, err: BaseException) -> NoReturn:
        self.count("504")
        raise UpstreamTimeoutError(
            f"instance {self.inst.instance_id!r} did not answer in time"
        ) from err


class Proxy:
    """Forwards requests for one app; holds the pooled upstream session."""

    def __init__(self, state: GatewayState, session: ClientSession) -> None:
        self.state = state
        self.session = session

    async def forward(
        self,
        request: web.Request,
        variant: VariantRuntime,
        *,
        router: RouterLike,
        key: RoutingKey,
        raw: bytes,
        path: str,
        t_start: float,
    ) -> web.StreamResponse:
        """Route ``raw`` to an instance of ``variant`` at ``path`` and relay its answer.

        ``router`` is the one that built ``key``: a strategy switch meanwhile applies to the
        next request, never to half of this one."""
        excluded: set[str] | None = None
        failure: WarmfleetError | None = None
        cost = key.prompt_tokens + key.output_tokens_hint
        headers = _upstream_headers(request)
        for attempt in range(self.state.limits.max_attempts):
            fleet = variant.snapshot(excluded)
            if not fleet.instances:
                break
            if attempt:
                variant.m_retries.inc()
            t_decide = perf_counter()
            try:
                decision = router.choose(key, fleet)
                variant.m_decision.observe(perf_counter() - t_decide)
                inst = variant.instances[decision.instance_id]
                router.on_routed(key, decision)
            except Exception as err:  # a strategy bug must not become an HTML 500 or a crash
                log.exception("routing failed in %s/%s", variant.endpoint, variant.name)
                failure = InternalError(f"routing failed: {type(err).__name__}")
                break
            _count_decision(variant, decision)
            inst.add_load(1, cost)
            try:
                call = _Attempt(request, variant, inst, decision, t_start)
                return await self._attempt(call, raw, path, headers)
            except _Retry as retry:
                failure = retry.cause
                excluded = excluded or set()
                excluded.add(inst.instance_id)
            except UpstreamTimeoutError as err:
                return error_response(err, instance=inst.instance_id, reason=decision.reason)
            finally:
                inst.add_load(-1, -cost)
        if failure is None:
            failure = NoInstanceAvailableError(
                f"no healthy instance in variant {variant.name!r} of endpoint {variant.endpoint!r}"
            )
        variant.request_counter("none", "unavailable", str(status_and_type(failure)[0])).inc()
        return error_response(failure, reason="unavailable")

    async def _attempt(
        self, call: _Attempt, raw: bytes, path: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        inst = call.inst
        call.variant.m_overhead.observe(perf_counter() - call.t_start)
        try:
            upstream = await self.session.post(
                inst.base_url + path, data=raw, headers=headers, timeout=self.state.upstream_timeout
            )
        except (ConnectionTimeoutError, ClientConnectorError) as err:
            self._failed(call, "connect", eject=True)
            raise _Retry(
                UpstreamError(f"instance {inst.instance_id!r} unreachable: {err}")
            ) from err
        except TimeoutError as err:
            call.timeout(err)
        except ClientConnectionError as err:
            self._failed(call, "disconnect", eject=False)
            raise _Retry(UpstreamError(f"instance {inst.instance_id!r} failed: {err!r}")) from err
        except ClientError as err:
            call.count("502")
            return error_response(
                UpstreamError(f"instance {inst.instance_id!r}: {err!r}"),
                instance=inst.instance_id,
                reason=call.decision.reason,
            )
        out_headers = _response_headers(upstream, inst, call.decision)
        if upstream.content_length is None:
            return await self._relay(call, upstream, out_headers)
        return await self._buffered(call, upstream, out_headers)

    async def _buffered(
        self, call: _Attempt, upstream: ClientResponse, out_headers: dict[str, str]
    ) -> web.StreamResponse:
        try:
            body = await upstream.read()
        except TimeoutError as err:
            upstream.close()
            call.timeout(err)
        except (ClientPayloadError, ClientConnectionError) as err:
            upstream.close()
            self._failed(call, "disconnect", eject=False)
            raise _Retry(
                UpstreamError(f"instance {call.inst.instance_id!r} failed: {err!r}")
            ) from err
        except asyncio.CancelledError:
            upstream.close()  # the client left; the instance sees the disconnect
            call.count("client_disconnect")
            raise
        call.variant.m_ttft["false"].observe(perf_counter() - call.t_start)
        call.count(str(upstream.status))
        return web.Response(body=body, status=upstream.status, headers=out_headers)

    async def _relay(
        self, call: _Attempt, upstream: ClientResponse, out_headers: dict[str, str]
    ) -> web.StreamResponse:
        content = upstream.content
        done = False
        try:
            try:
                chunk = await content.readany()  # headers go out with the first byte
            except TimeoutError as err:
                call.timeout(err)
            except (ClientPayloadError, ClientConnectionError) as err:
                self._failed(call, "disconnect", eject=False)
                raise _Retry(
                    UpstreamError(f"instance {call.inst.instance_id!r} failed: {err!r}")
                ) from err
            call.variant.m_ttft["true"].observe(perf_counter() - call.t_start)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(call.request)
            sse = out_headers["Content-Type"].startswith("text/event-stream")
            status = await self._pump(call, response, content, chunk, sse)
            done = status == str(upstream.status)
            call.count(status)
            return response
        except asyncio.CancelledError:
            call.count("client_disconnect")
            raise
        finally:
            if done:
                upstream.release()
            else:
                upstream.close()  # the instance sees the disconnect and can stop generating

    async def _pump(
        self,
        call: _Attempt,
        response: web.StreamResponse,
        content: StreamReader,
        chunk: bytes,
        sse: bool,
    ) -> str:
        """Relay until EOF. Returns the status label: the upstream status, ``stream_error`` or
        ``client_disconnect``."""
        framer = SseFramer() if sse else None
        failure: BaseException | None = None
        try:
            while chunk:
                out = framer.feed(chunk) if framer is not None else chunk
                if out:
                    await response.write(out)
                try:
                    chunk = await content.readany()
                except (TimeoutError, ClientPayloadError, ClientConnectionError) as err:
                    failure = err
                    break
            if failure is None:
                if framer is not None and (tail := framer.flush()):
                    await response.write(tail)
                await response.write_eof()
                return str(response.status)
            timed_out = isinstance(failure, TimeoutError)
            if not timed_out:
                self._failed(call, "stream", eject=False)
            log.warning("instance %s failed mid-stream: %r", call.inst.instance_id, failure)
            name = type(failure).__name__
            message = f"instance {call.inst.instance_id!r} failed mid-stream: {name}"
            await response.write(sse_error_event(message, code=504 if timed_out else 502))
            await response.write_eof()
            return "stream_error"
        except ConnectionResetError:
            return "client_disconnect"

    def _failed(self, call: _Attempt, cause: str, *, eject: bool) -> None:
        health = self.state.health
        if not health.passive_ejection:
            return
        threshold = 1 if eject else health.unhealthy_threshold
        call.variant.record_failure(call.inst, threshold, f"passive_{cause}")


def _count_decision(variant: VariantRuntime, decision: Decision) -> None:
    if decision.predicted_cached_blocks > 0:
        variant.m_prefix_hits.inc()
        variant.m_cached_blocks.inc(decision.predicted_cached_blocks)
    if decision.spilled:
        variant.spill_counter(decision.instance_id).inc()


def _upstream_headers(request: web.Request) -> dict[str, str]:
    incoming = request.headers
    headers = {"Content-Type": incoming.get(hdrs.CONTENT_TYPE, "application/json")}
    for name in _PASS_REQUEST_HEADERS:
        value = incoming.get(name)
        if value is not None:
            headers[name] = value
    return headers


def _response_headers(
    upstream: ClientResponse, inst: InstanceRuntime, decision: Decision
) -> dict[str, str]:
    incoming = upstream.headers
    headers = {
        "Content-Type": incoming.get(hdrs.CONTENT_TYPE, "application/octet-stream"),
        INSTANCE_HEADER: inst.instance_id,
        REASON_HEADER: decision.reason,
    }
    for name in _PASS_RESPONSE_HEADERS:
        value = incoming.get(name)
        if value is not None:
            headers[name] = value
    if headers["Content-Type"].startswith("text/event-stream"):
        headers["Cache-Control"] = "no-cache"
    return headers
