"""The access log (``spec.access_log``): one line per answered request on the logger
``warmfleet.gateway.access`` at INFO, with the instance and the reason of a routed one.

    POST /v1/chat/completions 200 12.41ms instance=vllm-1 reason=prefix_hit bytes_in=8123 \
        request_id=abc

(one line in the log)

A request the client left before its answer was complete logs status 499 (nginx's "client
closed request"). An error answered before routing logs ``instance=none reason=rejected`` (as
its headers say), an answer that names no instance (``/health``, ``/metrics``) ``instance=-``. A
request the HTTP layer rejects before it is whole (malformed, over the size limit, too slow) has
no line: ``warmfleet_gateway_rejected_requests_total`` counts it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from warmfleet.gateway.http.messages import INSTANCE_HEADER, REASON_HEADER, Request

CLIENT_CLOSED = 499


class AccessLog:
    """Writes the lines; the HTTP server calls ``record`` once per request it answered."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("warmfleet.gateway.access")

    def record(
        self,
        request: Request,
        status: int,
        headers: Mapping[str, str] | None,
        duration_s: float,
    ) -> None:
        answer = headers or {}
        self.logger.info(
            "%s %s %d %.2fms instance=%s reason=%s bytes_in=%d request_id=%s",
            request.method,
            request.path,
            status,
            1000.0 * duration_s,
            answer.get(INSTANCE_HEADER, "-"),
            answer.get(REASON_HEADER, "-"),
            len(request.body),
            request.headers.get("x-request-id", "-"),
        )
