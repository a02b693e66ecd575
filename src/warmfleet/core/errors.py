"""The one exception tree of the core.

Mapping to HTTP status codes and the OpenAI error envelope happens only at the gateway edge.
"""

from __future__ import annotations


class WarmfleetError(Exception):
    """Base of every error raised by warmfleet code."""


class ConfigError(WarmfleetError):
    """Invalid configuration; the message names the offending field."""


class BadRequestError(WarmfleetError):
    """The client's request cannot be understood (maps to HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RequestTooLargeError(BadRequestError):
    """The request body is over the configured size limit (maps to HTTP 413)."""


class NotFoundError(WarmfleetError):
    """Unknown model, endpoint or variant (maps to HTTP 404)."""


class NoInstanceAvailableError(WarmfleetError):
    """No healthy instance can take the request (maps to HTTP 503)."""


class CacheError(WarmfleetError):
    """Base of model/image cache errors."""


class InsufficientCapacityError(CacheError):
    """An artifact does not fit the disk budget; the message names the shortfall."""

    def __init__(self, message: str, *, needed_bytes: int, available_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes


class IntegrityError(CacheError):
    """Downloaded bytes do not match the manifest (size or digest)."""
