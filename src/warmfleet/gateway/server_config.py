"""The gateway's own settings in its configuration document (``spec.listen``, ``spec.limits``,
``spec.admin``, ``spec.health``): how it listens, what a request may cost, the admin token, and
how instances are checked. ``config.py`` composes them into the ``Gateway`` document (and
re-exports them)."""

from __future__ import annotations

import os

from pydantic import Field, model_validator

from warmfleet.core.config import StrictModel
from warmfleet.core.errors import ConfigError


class ListenConfig(StrictModel):
    """``max_connections``: client connections held open at once (0: half the process's
    open-file limit, the other half left to instances and files). A client beyond it takes the
    place of the connection idle the longest, or gets a 503 when none is idle."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_connections: int = Field(default=0, ge=0)


class KeyBodyLimits(StrictModel):
    """The largest body (bytes) a variant keys, per key mode (``routing.key.mode``); over it,
    400. ``tokens`` keys cost a chat template and a tokenizer: ~1 µs per byte, 4 MiB ≈ 1M
    tokens, more than any engine's context."""

    text: int = Field(default=8 << 20, ge=1)
    bytes: int = Field(default=8 << 20, ge=1)
    tokens: int = Field(default=4 << 20, ge=1)


class LimitsConfig(StrictModel):
    """Per-request limits. ``body_read_timeout_s`` bounds how long a client may take to send its
    body (slow senders get 408); the upstream timeouts bound every outbound call.
    ``upstream_connect_timeout_s`` also bounds the wait for a free upstream connection at
    ``max_upstream_connections`` (then 503 with ``Retry-After``, reason ``pool_timeout``).

    The work a body costs is bounded (400 naming the param over a limit): JSON nesting depth,
    messages and content parts of a chat, prompts of a completions batch, body size per key
    mode. Bodies over ``offload_body_bytes`` are parsed and keyed on the gateway's one body
    worker thread, never on the event loop (docs/gateway.md, "Expensive bodies")."""

    max_body_bytes: int = Field(default=8 << 20, ge=1)
    offload_body_bytes: int = Field(default=64 << 10, ge=0)
    max_json_depth: int = Field(default=128, ge=2, le=256)
    max_messages: int = Field(default=20_000, ge=1)
    max_content_parts: int = Field(default=50_000, ge=1)
    max_prompts: int = Field(default=16_384, ge=1)
    max_key_body_bytes: KeyBodyLimits = Field(default_factory=KeyBodyLimits)
    # bodies of all connections still being received; past it, reading waits (back-pressure)
    max_buffered_body_bytes: int = Field(default=32 << 20, ge=1)
    body_read_timeout_s: float = Field(default=30.0, gt=0)
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0)
    upstream_read_timeout_s: float = Field(default=120.0, gt=0)
    upstream_total_timeout_s: float = Field(default=1800.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=16)
    max_upstream_connections: int = Field(default=0, ge=0)  # 0 = unlimited

    @model_validator(mode="after")
    def _budget_holds_a_body(self) -> LimitsConfig:
        if self.max_buffered_body_bytes < self.max_body_bytes:
            raise ValueError(
                "maxBufferedBodyBytes must be at least maxBodyBytes (a body of the maximum "
                "size could never be received)"
            )
        return self


class AdminConfig(StrictModel):
    """The admin API is off unless a bearer token is configured (inline or from an env var)."""

    token: str | None = Field(default=None, min_length=16)
    token_env: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> AdminConfig:
        if self.token is not None and self.token_env is not None:
            raise ValueError("set at most one of token and tokenEnv")
        return self

    def resolved_token(self) -> str | None:
        if self.token_env is None:
            return self.token
        value = os.environ.get(self.token_env)
        if value is not None and len(value) < 16:
            raise ConfigError(f"spec.admin.tokenEnv: ${self.token_env} is shorter than 16 chars")
        return value


class OutlierConfig(StrictModel):
    """Passive outlier detection (Envoy's ``consecutive_gateway_failure``) on real requests.

    ``consecutive_failures`` gateway failures in a row (connect error, a timeout or a dropped
    connection before the answer, a 502/503/504 answer, a failure mid-stream) eject an
    instance; a refused connection ejects at once. The n-th ejection lasts
    ``min(base_ejection_time_s * n, max_ejection_time_s)``; then the instance is on probation
    (one request at a time): a success readmits it, a failure ejects it again, for longer.
    ``max_ejection_percent`` of a variant's instances (at least one) may be ejected at once."""

    consecutive_failures: int = Field(default=3, ge=1, le=100)
    base_ejection_time_s: float = Field(default=30.0, gt=0)
    max_ejection_time_s: float = Field(default=300.0, gt=0)
    max_ejection_percent: int = Field(default=50, ge=0, le=100)

    @model_validator(mode="after")
    def _max_not_below_base(self) -> OutlierConfig:
        if self.max_ejection_time_s < self.base_ejection_time_s:
            raise ValueError("maxEjectionTimeS must not be below baseEjectionTimeS")
        return self


class HealthConfig(StrictModel):
    """Active polling of each instance's health path; ejection after ``unhealthy_threshold``
    consecutive failures, readmission after ``healthy_threshold`` consecutive successes.
    ``passive_ejection`` turns on ``outlier`` detection on real requests, whose ejections only
    real requests end (a passing health probe does not)."""

    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)
    unhealthy_threshold: int = Field(default=2, ge=1)
    healthy_threshold: int = Field(default=2, ge=1)
    path: str = Field(default="/health", pattern=r"^/")
    passive_ejection: bool = True
    outlier: OutlierConfig = Field(default_factory=OutlierConfig)

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> HealthConfig:
        if self.timeout_s > self.interval_s:
            raise ValueError("timeoutS must not exceed intervalS")
        return self
