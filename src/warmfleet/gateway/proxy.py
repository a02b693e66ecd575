"""The hot path: choose an instance, send the client's bytes unchanged, relay the answer.

- The body is forwarded as received (never re-serialized); the answer is relayed as it arrives,
  from inside the upstream connection's ``data_received`` (no task switch per chunk). SSE
  events are written as soon as they are complete; a partial event is held only until its end
  arrives, so an error event can never be glued onto half an event.
- Retries go to another instance, and only before any byte reached the client: a refused or
  dropped connection, and a timeout waiting for the answer (a wedged instance).
- With ``maxUpstreamConnections``, a request waits for a free connection at most the connect
  timeout, then gets 503 with ``Retry-After`` (reason ``pool_timeout``; not the instance's
  failure, so not retried).
- Every attempt's outcome feeds passive outlier detection (``gateway.outlier``): gateway
  failures eject an instance, and a probation instance gets one request at a time.
- In-flight requests and tokens per instance are counted here and fed to the strategy (with
  replica sync, the peers' too, and every routing and end is a note for them).
"""

from __future__ import annotations

import asyncio
import logging
import math
from time import perf_counter

from warmfleet.core.errors import NoInstanceAvailableError, WarmfleetError
from warmfleet.core.types import Decision, RoutingKey
from warmfleet.gateway.capture import Capture
from warmfleet.gateway.errors import (
    InternalError,
    UpstreamBusyError,
    error_response,
    sse_error_event,
    status_and_type,
)
from warmfleet.gateway.flow import FlowIdentity, GatewayFlow, Ticket
from warmfleet.gateway.hold import GatewayHold
from warmfleet.gateway.http.messages import Request, Response
from warmfleet.gateway.http.upstream import (
    Origin,
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamConnection,
    UpstreamTimeout,
)
from warmfleet.gateway.http.upstream_pool import UpstreamPool, UpstreamPoolTimeout
from warmfleet.gateway.outlier import IN, PROBATION, FailureCause
from warmfleet.gateway.relay import ATTEMPTS_HEADER, Attempt, Relay, Retry, prompt_id
from warmfleet.gateway.variant import RouterLike, VariantRuntime
from warmfleet.gateway.world import GatewayState

log = logging.getLogger(__name__)

# The client's headers the instance gets: its credentials, its request id and its W3C trace
# context (vLLM's OpenTelemetry tracing continues the client's trace from them).
_PASS_REQUEST_HEADERS = ("authorization", "x-request-id", "traceparent", "tracestate", "baggage")
# Answers that count as the instance failing (Envoy's gateway failures), though relayed.
_GATEWAY_FAILURE_STATUSES = frozenset((502, 503, 504))


class Proxy:
    """Forwards requests for one gateway; holds the pooled upstream connections."""

    def __init__(self, state: GatewayState, pool: UpstreamPool) -> None:
        self.state = state
        self.pool = pool
        self.capture: Capture | None = None  # spec.capture: a line per answered request
        self.hold: GatewayHold | None = None  # spec.hold: wait for a first ready instance
        self.flow: GatewayFlow | None = None  # routing.flow: the variants' flow gates

    async def forward(
        self,
        request: Request,
        variant: VariantRuntime,
        *,
        router: RouterLike,
        key: RoutingKey,
        path: str,
        t_start: float,
        method: str = "POST",
        model: str | None = None,
        flow: FlowIdentity | None = None,
    ) -> Response | None:
        """Route ``request.body`` to an instance of ``variant`` at ``path`` and relay its answer
        (``None`` once the relay has answered the client; an error response otherwise).
        ``method``: ``GET`` sends no body (vLLM's ``/version``). ``model``: the body's, for
        the capture. ``flow``: the request's flow identity; with the variant's ``routing.flow``
        the request goes through its flow gate first (``gateway.flow``), which may queue it,
        route it, or answer it 429/503.

        ``router`` is the one that built ``key``: a strategy switch meanwhile applies to the
        next request, never to half of this one. (A removed variant is neither queued nor held.)"""
        ticket: Ticket | None = None
        if (
            flow is not None
            and self.flow is not None
            and variant.routing_config.flow is not None
            and not variant.series_gone
        ):
            admitted = await self.flow.admit(variant, router, key, flow)
            if isinstance(admitted, Response):
                return admitted
            ticket = admitted
        elif not variant.routable and (shed := await self._hold(variant)) is not None:
            return shed
        try:
            return await self._route(
                request,
                variant,
                router=router,
                key=key,
                path=path,
                t_start=t_start,
                method=method,
                model=model,
                ticket=ticket,
            )
        finally:
            if ticket is not None:
                ticket.done()

    async def _hold(self, variant: VariantRuntime) -> Response | None:
        """With ``spec.hold`` active, wait until one of ``variant``'s instances is ready (scale
        from zero); the answer if the request is shed instead."""
        if self.hold is None or not self.hold.active() or variant.series_gone:
            return None
        return await self.hold.wait(variant)

    async def _route(
        self,
        request: Request,
        variant: VariantRuntime,
        *,
        router: RouterLike,
        key: RoutingKey,
        path: str,
        t_start: float,
        method: str,
        model: str | None,
        ticket: Ticket | None,
    ) -> Response | None:
        """The attempts (a retry goes to another instance); the first one of a flow-controlled
        request goes where its gate dispatched it (committed there)."""
        # A prompt that failed recently on an instance does not go there first (affinity).
        excluded = variant.avoided(prompt_id(key)) if variant.avoidance.entries else None
        avoided = len(excluded) if excluded else 0
        failure: WarmfleetError | None = None
        cost = key.prompt_tokens + key.output_tokens_hint
        for attempt in range(self.state.limits.max_attempts):
            if attempt == 0 and ticket is not None:
                decision, inst, note = ticket.decision, ticket.inst, ticket.note
            else:
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
                except Exception as err:  # a strategy bug must not become an HTML 500 or a crash
                    failure = _routing_failed(variant, err)
                    break
                inst.add_load(1, cost)
            _count_decision(variant, decision)
            call = Attempt(
                request, variant, inst, decision, t_start, key=key, index=attempt, model=model
            )
            call.ticket = ticket
            if ticket is None or attempt:
                call.learner = router  # learns it once its bytes are on the way (``_attempt``)
            else:
                call.note = note
            try:
                if inst.outlier.standing is PROBATION:
                    variant.begin_trial(inst, call)  # its one request until it has answered
                return await self._attempt(call, path, method)
            except Retry as retry:
                failure = retry.cause
                excluded = excluded or set()
                excluded.add(inst.instance_id)
            finally:
                inst.add_load(-1, -cost)
                call.release_note()  # if the answer's end did not already
                if inst.outlier.trial is call:
                    variant.end_trial(inst, call)  # no verdict (the client left)
        return _unavailable(variant, failure, len(excluded) - avoided if excluded else 0)

    async def _attempt(self, call: Attempt, path: str, method: str) -> Response | None:
        inst = call.inst
        origin = inst.origin
        up = self.pool.take_idle(origin.addr)
        if up is None:
            opened = await self._acquire(call)
            if isinstance(opened, Response):
                return opened
            up = opened
        limits = self.state.limits
        call.variant.m_overhead.observe(perf_counter() - call.t_start)
        relay = Relay(call)
        conn = relay.conn
        conn.on_pause = up.pause_reading
        ex = up.start(
            _request_bytes(call.request, origin, origin.prefix + path.encode(), method),
            limits.upstream_read_timeout_s,
            limits.upstream_total_timeout_s,
            relay,
        )
        # The router learns the decision while the instance reads the request: off a lone
        # request's critical path, and before any other request can be routed (no await since
        # ``choose``: the answer's callbacks and the next request wait for this one to yield).
        if (failure := _learn(call)) is not None:
            up.abort()
            conn.on_pause = None
            return _unavailable(call.variant, failure, 0)
        try:
            await ex.done  # the relay has answered the client by now
        except asyncio.CancelledError:
            if up.exchange is ex:  # still ours (done: it may already serve another request)
                up.abort()  # the client left; the instance sees the disconnect
            call.count("client_disconnect")
            raise
        except UpstreamTimeout as timeout:
            if relay.started:
                self._mid_stream_failure(call, relay, timeout)
                return None
            call.failed(FailureCause.TIMEOUT, "did not answer in time", timeout)
        except UpstreamClosedError as closed:
            if relay.started:
                self._mid_stream_failure(call, relay, closed)
                return None
            call.failed(FailureCause.DISCONNECT, "failed", closed)
        finally:
            conn.on_pause = None
        self._answered(call, relay, ex.status)
        return None

    def _answered(self, call: Attempt, relay: Relay, status: int) -> None:
        """The instance answered ``status`` and the relay has passed it on: its outlier
        standing, the request's count and its capture. (Its load is released by the caller
        now, not when the client has read the answer: the server holds the connection's next
        request until then.)"""
        inst = call.inst
        if status in _GATEWAY_FAILURE_STATUSES:  # relayed, but counts against the instance
            call.variant.passive_failure(inst, FailureCause.STATUS, prompt_id(call.key))
        elif inst.outlier.consecutive_failures or inst.outlier.standing is not IN:
            call.variant.passive_success(inst)  # resets its count, or ends its probation
        call.count("client_disconnect" if relay.conn.closed else str(status))
        if self.capture is not None:
            self.capture.offer(call, relay, status)

    async def _acquire(self, call: Attempt) -> UpstreamConnection | Response:
        """A new or freed connection to the call's instance (none was idle), or the answer:
        the router learns the decision first (the next decision, made while this one waits,
        must know of it); every connection busy for the connect timeout is a 503 (the
        gateway's limit, not the instance's failure: reason ``pool_timeout``)."""
        if (failure := _learn(call)) is not None:
            return _unavailable(call.variant, failure, 0)
        pool = self.pool
        try:
            return await pool.acquire(call.inst.origin.addr)
        except UpstreamConnectError as err:
            call.failed(FailureCause.CONNECT, "unreachable", err)
        except UpstreamPoolTimeout as busy:
            call.variant.request_counter("none", "pool_timeout", "503").inc()
            retry_after = str(max(1, math.ceil(pool.connect_timeout_s)))
            error = UpstreamBusyError(f"{busy}; retry after {retry_after} s")
            headers = {"Retry-After": retry_after}
            return error_response(error, reason="pool_timeout", extra_headers=headers)

    def _mid_stream_failure(self, call: Attempt, relay: Relay, err: Exception) -> None:
        timed_out = isinstance(err, UpstreamTimeout)
        call.variant.passive_failure(call.inst, FailureCause.STREAM, prompt_id(call.key))
        log.warning("instance %s failed mid-stream: %r", call.inst.instance_id, err)
        name = type(err).__name__
        message = f"instance {call.inst.instance_id!r} failed mid-stream: {name}"
        if relay.length is not None or relay.framer is None:  # only a cut tells the client
            # (a declared length, or a body that is not an event stream: an SSE error event
            # and a clean end would make it look whole)
            call.count("stream_error")
            if relay.conn.transport is not None:
                relay.conn.transport.abort()
            return
        relay.drop_partial()
        relay.conn.send(sse_error_event(message, code=504 if timed_out else 502), end=True)
        call.count("stream_error")
        if self.capture is not None:
            self.capture.offer(call, relay, 504 if timed_out else 502)


def _routing_failed(variant: VariantRuntime, err: Exception) -> InternalError:
    log.exception("routing failed in %s/%s", variant.endpoint, variant.name, exc_info=err)
    return InternalError(f"routing failed: {type(err).__name__}")


def _learn(call: Attempt) -> InternalError | None:
    """The router learns ``call``'s decision (with replica sync: the note for the peers), once;
    the error if it failed (a strategy bug)."""
    router, call.learner = call.learner, None
    if router is not None:
        try:
            call.note = call.variant.routed(router, call.key, call.decision)
        except Exception as err:
            return _routing_failed(call.variant, err)
    return None


def _unavailable(variant: VariantRuntime, failure: WarmfleetError | None, tried: int) -> Response:
    """Every attempt failed (``failure``: the last one's error; ``tried`` instances), or no
    instance was left."""
    if failure is None:
        failure = NoInstanceAvailableError(
            f"no healthy instance in variant {variant.name!r} of endpoint {variant.endpoint!r}"
        )
    variant.request_counter("none", "unavailable", str(status_and_type(failure)[0])).inc()
    extra = {ATTEMPTS_HEADER: str(tried)} if tried > 1 else None
    return error_response(failure, reason="unavailable", extra_headers=extra)


def _count_decision(variant: VariantRuntime, decision: Decision) -> None:
    if decision.predicted_cached_blocks > 0:
        variant.m_prefix_hits.inc()
        variant.m_cached_blocks.inc(decision.predicted_cached_blocks)
    if decision.spilled:
        variant.spill_counter(decision.instance_id).inc()


def _request_bytes(request: Request, origin: Origin, target: bytes, method: str) -> bytes:
    """The upstream request: the client's body unchanged, with the few headers that matter."""
    incoming = request.headers
    ctype = incoming.get("content-type", "application/json")
    extra = "".join(
        f"{name}: {incoming[name]}\r\n" for name in _PASS_REQUEST_HEADERS if name in incoming
    )
    if method == "GET":
        return b"GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
            target,
            origin.host_header,
            extra.encode("latin-1") + origin.extra_headers,
        )
    body = request.body
    return b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        target,
        origin.host_header,
        ctype.encode("latin-1"),
        len(body),
        extra.encode("latin-1") + origin.extra_headers,
        body,
    )
