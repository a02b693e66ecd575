"""The edge: core errors -> HTTP status + the OpenAI error envelope.

This is the only place where warmfleet errors become HTTP. Every error body is
``{"error": {"message", "type", "param", "code"}}`` with ``Content-Type: application/json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from warmfleet.core.errors import (
    BadRequestError,
    ConfigError,
    NoInstanceAvailableError,
    NotFoundError,
    RequestTooLargeError,
    WarmfleetError,
)
from warmfleet.gateway.http.messages import INSTANCE_HEADER, REASON_HEADER, Response

NO_INSTANCE = "none"


class UnauthorizedError(WarmfleetError):
    """Missing or wrong admin bearer token (HTTP 401)."""


class ConflictError(WarmfleetError):
    """The change conflicts with the current state (HTTP 409)."""


class UpstreamError(WarmfleetError):
    """Every attempt to reach an instance failed before any byte reached the client (502)."""


class InternalError(WarmfleetError):
    """A bug inside the gateway or a strategy (HTTP 500, still the JSON envelope)."""


class UpstreamTimeoutError(WarmfleetError):
    """The instance did not answer in time (HTTP 504)."""


class OverloadedError(WarmfleetError):
    """Flow control shed the request: overload, or a deadline it cannot meet (HTTP 429)."""


class UpstreamBusyError(WarmfleetError):
    """Every upstream connection the gateway may open (``maxUpstreamConnections``) stayed busy
    for the connect timeout (HTTP 503)."""


# (status, OpenAI error type), most specific class first.
_MAPPING: tuple[tuple[type[WarmfleetError], int, str], ...] = (
    (RequestTooLargeError, 413, "invalid_request_error"),
    (BadRequestError, 400, "invalid_request_error"),
    (ConfigError, 400, "invalid_request_error"),
    (NotFoundError, 404, "not_found_error"),
    (UnauthorizedError, 401, "authentication_error"),
    (ConflictError, 409, "conflict_error"),
    (NoInstanceAvailableError, 503, "service_unavailable_error"),
    (UpstreamBusyError, 503, "service_unavailable_error"),
    (OverloadedError, 429, "rate_limit_error"),
    (UpstreamTimeoutError, 504, "upstream_timeout_error"),
    (UpstreamError, 502, "upstream_error"),
)


def status_and_type(err: WarmfleetError) -> tuple[int, str]:
    for cls, status, kind in _MAPPING:
        if isinstance(err, cls):
            return status, kind
    return 500, "internal_error"


def error_body(message: str, kind: str, param: str | None, code: int | str | None) -> bytes:
    envelope = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json.dumps(envelope).encode()


def error_response(
    err: WarmfleetError,
    *,
    instance: str = NO_INSTANCE,
    reason: str = "rejected",
    extra_headers: Mapping[str, str] | None = None,
) -> Response:
    status, kind = status_and_type(err)
    param = err.param if isinstance(err, BadRequestError) else None
    headers = {INSTANCE_HEADER: instance, REASON_HEADER: reason}
    if status == 401:  # RFC 9110 11.6.1: a 401 names the scheme it wants
        headers["WWW-Authenticate"] = 'Bearer realm="warmfleet-admin"'
    if extra_headers:
        headers.update(extra_headers)
    return Response(status, error_body(str(err), kind, param, status), headers=headers)


_KIND_BY_STATUS = {404: "not_found_error", 500: "internal_error"}


def plain_error(status: int, message: str, kind: str | None = None) -> Response:
    """An envelope for errors raised by the HTTP layer itself (malformed request, body too
    large or too slow, unknown route, wrong method)."""
    kind = kind or _KIND_BY_STATUS.get(status, "invalid_request_error")
    return Response(
        status,
        error_body(message, kind, None, status),
        headers={INSTANCE_HEADER: NO_INSTANCE, REASON_HEADER: "rejected"},
    )


def sse_error_event(message: str, kind: str = "upstream_error", code: int = 502) -> bytes:
    """The event that ends a stream whose upstream failed after bytes reached the client."""
    return b"data: " + error_body(message, kind, None, code) + b"\n\n"
