"""One try of a request on one instance (``Attempt``) and its answer's way back to the client
(``Relay``), driven by the upstream connection's callbacks: a ``Content-Length`` answer of up to
1 MiB is written whole when complete, any other is streamed, one client write per read from the
instance, SSE cut at event boundaries (``SseFramer``). Until the first byte is written the
attempt can still be retried elsewhere (``Retry``)."""

from __future__ import annotations

from time import perf_counter
from typing import NoReturn

from warmfleet.core.errors import WarmfleetError
from warmfleet.core.types import Decision, RoutingKey
from warmfleet.gateway.errors import UpstreamError, UpstreamTimeoutError
from warmfleet.gateway.flow import Ticket
from warmfleet.gateway.http.messages import (
    INSTANCE_HEADER,
    REASON_HEADER,
    ClientConnection,
    Request,
    Response,
)
from warmfleet.gateway.http.upstream import FRAMING_HEADERS, Exchange
from warmfleet.gateway.instance import InstanceRuntime
from warmfleet.gateway.outlier import FailureCause
from warmfleet.gateway.variant import RouterLike, VariantRuntime
from warmfleet.routing.replica_notes import RoutedNote

_MAX_HELD_EVENT_BYTES = 1 << 20
# On a retried request's answer (or its final error): how many instances were tried.
ATTEMPTS_HEADER = "x-warmfleet-attempts"
# A Content-Length answer up to this size is relayed whole in one write once complete; a larger
# one is relayed as it arrives (with its length), so a request never holds more than the
# client's write buffer and one read of it, whatever the instance declares.
_MAX_BUFFERED_ANSWER_BYTES = 1 << 20


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


class Retry(Exception):
    """An attempt failed before any byte reached the client; try another instance."""

    def __init__(self, cause: WarmfleetError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Attempt:
    """One try of one request on one instance."""

    __slots__ = (
        "decision",
        "index",
        "inst",
        "key",
        "learner",
        "model",
        "note",
        "request",
        "t_start",
        "ticket",
        "variant",
    )

    def __init__(
        self,
        request: Request,
        variant: VariantRuntime,
        inst: InstanceRuntime,
        decision: Decision,
        t_start: float,
        *,
        key: RoutingKey,
        index: int,
        model: str | None = None,
    ) -> None:
        self.request = request
        self.key = key
        self.variant = variant
        self.inst = inst
        self.decision = decision
        self.t_start = t_start
        self.index = index  # 0: the first attempt
        self.model = model  # the body's model, when the caller knows it (the capture's)
        self.ticket: Ticket | None = None  # flow control's, told of the first streamed bytes
        self.note: RoutedNote | None = None  # with replica sync: this routing's note
        self.learner: RouterLike | None = None  # made ``decision``, has yet to learn it (proxy)

    def release_note(self) -> None:
        """The request ended at the instance: its replica-sync note is finished (once). Called
        as the upstream's answer completes, before its last bytes reach the client, so that the
        peers hear of the end before the client can send its next request to one of them."""
        note, self.note = self.note, None
        if note is not None:
            self.variant.finished(note)

    def count(self, status: str) -> None:
        self.variant.request_counter(self.inst.instance_id, self.decision.reason, status).inc()

    def failed(self, cause: FailureCause, message: str, err: BaseException) -> NoReturn:
        """This attempt failed before any byte reached the client: count it against the
        instance and let ``forward`` try another one."""
        self.variant.passive_failure(self.inst, cause, prompt_id(self.key))
        name = self.inst.instance_id
        if cause is FailureCause.TIMEOUT:
            raise Retry(UpstreamTimeoutError(f"instance {name!r} {message}")) from err
        raise Retry(UpstreamError(f"instance {name!r} {message}: {err}")) from err


class Relay:
    """The answer's way to the client, driven by the upstream connection's callbacks: a
    ``Content-Length`` answer is written whole when complete; any other is streamed, one client
    write per read from the instance, its head going out with its first bytes. Until the first
    byte is written (``started``) the attempt can still be retried elsewhere."""

    __slots__ = (
        "buffered",
        "call",
        "conn",
        "content_type",
        "framer",
        "head_only",
        "headers",
        "last",
        "length",
        "pending",
        "size",
        "started",
        "status",
        "t_first",
        "tail",
    )

    def __init__(self, call: Attempt) -> None:
        self.call = call
        self.conn: ClientConnection = call.request.conn
        self.status = 0
        self.content_type = "application/octet-stream"
        self.headers: dict[str, str] = {}
        self.buffered = True
        self.length: int | None = None  # a declared length relayed as it arrives
        self.framer: SseFramer | None = None
        self.started = False
        self.pending: list[bytes] = []
        self.t_first = 0.0  # perf_counter when the first byte went to the client
        # where the answer's usage is: its last piece (buffered: all of it) and the one before
        self.last = b""
        self.tail = b""
        # A HEAD request (relayed as a GET: ``/version``): answered whole at the end with the
        # GET answer's length (counted in ``size``) and no body, however the instance framed it.
        self.head_only = call.request.method == "HEAD"
        self.size = 0

    def head(self, ex: Exchange) -> None:
        self.status = ex.status
        self.content_type = ex.content_type
        self.headers = response_headers(ex, self.call)
        if self.head_only:  # counted, answered whole (``end``)
            return
        self.buffered = not ex.chunked
        if self.buffered:
            declared = ex.headers.get("content-length", "").strip()
            if declared.isdigit() and int(declared) > _MAX_BUFFERED_ANSWER_BYTES:
                self.buffered = False
                self.length = int(declared)
        elif ex.content_type.startswith("text/event-stream"):
            self.framer = SseFramer()

    def data(self, chunk: bytes) -> None:
        if self.head_only:
            self.size += len(chunk)
            return
        if self.framer is not None:
            chunk = self.framer.feed(chunk)
        if chunk:
            self.pending.append(chunk)

    def flush(self) -> None:
        pending = self.pending
        if self.buffered or not pending:
            return
        out = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        self.tail = out
        if self.started:
            self.conn.send(out)
        else:
            self._start(out)

    def end(self, ex: Exchange) -> None:
        call = self.call
        call.release_note()
        if self.buffered:
            self.started = True
            self.t_first = now = perf_counter()
            call.variant.m_ttft["false"].observe(now - call.t_start)
            request = call.request
            answer = Response(ex.status, b"".join(self.pending), self.content_type, self.headers)
            self.last = answer.body
            head_only, length = self.head_only, self.size if self.head_only else -1
            self.conn.write_response(answer, request.keep_alive, request.http10, head_only, length)
            return
        if self.framer is not None and (tail := self.framer.flush()):
            self.pending.append(tail)
        out = b"".join(self.pending)
        self.pending.clear()
        self.last = out  # the usage event may be in it, or in ``tail`` before [DONE]
        if not self.started:
            self._start(out, end=True)  # the whole stream arrived at once: one write
        else:
            self.conn.send(out, end=True)

    def _start(self, first: bytes, *, end: bool = False) -> None:
        self.started = True
        call = self.call
        self.t_first = now = perf_counter()
        call.variant.m_ttft["true"].observe(now - call.t_start)
        if call.ticket is not None:
            call.ticket.first_token()
        conn = self.conn
        conn.start_stream(
            self.status, self.content_type, self.headers, first, end=end, length=self.length
        )

    def drop_partial(self) -> None:
        """Write the whole events received, forget half an event: an error event must stand
        alone."""
        self.flush()
        if self.framer is not None:
            self.framer.flush()


def prompt_id(key: RoutingKey) -> int:
    """Names a prompt for ``PromptAvoidance``: its last block hash (chained: it covers every
    block), else its prefix hash (short prompts, keys without block hashes)."""
    return key.block_hashes[-1] if key.block_hashes else key.prefix_hash


def response_headers(ex: Exchange, call: Attempt) -> dict[str, str]:
    """The gateway's own headers (instance, routing reason, attempts) and the instance's that
    the client reads (``upstream.RELAYED_HEADERS``, ``x-ratelimit-*``: the only others the
    upstream connection keeps besides the framing ones)."""
    headers = {INSTANCE_HEADER: call.inst.instance_id, REASON_HEADER: call.decision.reason}
    if call.index:
        headers[ATTEMPTS_HEADER] = str(call.index + 1)
    for name, value in ex.headers.items():
        if name not in FRAMING_HEADERS:
            headers[name] = value
    if ex.content_type.startswith("text/event-stream"):
        headers["Cache-Control"] = "no-cache"
    return headers
