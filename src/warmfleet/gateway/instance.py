"""One instance of one variant as the gateway sees it: address, load, and health (active
probes and the passive standing of ``gateway.outlier``)."""

from __future__ import annotations

from warmfleet.core.types import InstanceState
from warmfleet.gateway.config import InstanceSpec, redacted_url
from warmfleet.gateway.http.upstream import Origin
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.outlier import EJECTED, OutlierRecord


class InstanceRuntime:
    """One instance of one variant: where it is, its health and the load the gateway sent it.

    ``active_healthy``: what the health probes say; ``outlier``: what real requests say (the
    passive standing). It takes traffic when both allow it."""

    __slots__ = (
        "active_healthy",
        "base_url",
        "data_parallel_rank",
        "engine_stats_read_s",
        "failures",
        "in_flight_requests",
        "in_flight_tokens",
        "instance_id",
        "kv_capacity_blocks",
        "kv_capacity_tokens",
        "kv_usage_frac",
        "m_in_flight",
        "m_kv_capacity",
        "origin",
        "outlier",
        "removed",
        "state",
        "successes",
        "synced",
        "waiting_requests",
    )

    def __init__(
        self, spec: InstanceSpec, metrics: GatewayMetrics, endpoint: str, variant: str
    ) -> None:
        self.instance_id = spec.id
        self.base_url = spec.url
        self.data_parallel_rank = spec.data_parallel_rank
        self.origin = Origin(spec.url, spec.data_parallel_rank)
        self.active_healthy = True
        self.failures = 0  # consecutive failed health probes
        self.successes = 0  # consecutive good health probes
        self.outlier = OutlierRecord(spec.id)
        self.in_flight_requests = 0
        self.in_flight_tokens = 0
        self.removed = False
        # the engine's KV capacity (``gateway.kv_capacity`` reads it from its metrics): in
        # tokens, and in the variant's routing-key blocks as strategies see it; 0: unknown
        self.kv_capacity_tokens = 0
        self.kv_capacity_blocks = 0
        # the engine's own queue and KV usage, polled for strategies that read them
        # (``gateway.engine_stats``); 0: not polled, or not read lately
        self.waiting_requests = 0
        self.kv_usage_frac = 0.0
        self.engine_stats_read_s = 0.0  # when they were last read (the probe's clock)
        self.m_in_flight = metrics.in_flight.labels(endpoint, variant, spec.id)
        self.m_kv_capacity = metrics.kv_capacity.labels(endpoint, variant, spec.id)
        self.state = InstanceState(spec.id)  # what strategies see; rebuilt on every load change
        self.synced = self.state  # with replica sync: the last ``synced_state`` built
        metrics.healthy.labels(endpoint, variant, spec.id).set(1)

    @property
    def takes_traffic(self) -> bool:
        """In the variant's healthy set (the router's view; a probation instance included)."""
        return self.active_healthy and self.outlier.standing is not EJECTED

    def describe(self, now_s: float) -> dict[str, object]:
        """This instance in the admin API (``kv_capacity_*`` None: unknown, the default)."""
        return {
            "id": self.instance_id,
            "url": redacted_url(self.base_url),
            "data_parallel_rank": self.data_parallel_rank,
            "healthy": self.takes_traffic,
            "active_healthy": self.active_healthy,
            "outlier": self.outlier.describe(now_s),
            "in_flight_requests": self.in_flight_requests,
            "in_flight_tokens": self.in_flight_tokens,
            "kv_capacity_tokens": self.kv_capacity_tokens or None,
            "kv_capacity_blocks": self.kv_capacity_blocks or None,
            "waiting_requests": self.waiting_requests,  # as polled (gateway.engine_stats)
            "kv_usage_frac": self.kv_usage_frac,
        }

    def add_load(self, requests: int, tokens: int) -> None:
        """A request of ``tokens`` tokens starts (``requests=1``) or ends (``-1``, ``-tokens``)."""
        self.in_flight_requests += requests
        self.in_flight_tokens += tokens
        self.m_in_flight.inc(requests)
        self._restate()

    def set_kv_capacity(self, tokens: int, blocks: int) -> None:
        """The engine's KV capacity, ``tokens`` (0: unknown), ``blocks`` in routing-key blocks."""
        self.kv_capacity_tokens = tokens
        self.kv_capacity_blocks = blocks
        self.m_kv_capacity.set(blocks)
        self._restate()

    def set_engine_stats(
        self, waiting_requests: int, kv_usage_frac: float, *, read_s: float = 0.0
    ) -> None:
        """The engine's queue and KV usage as its metrics said at ``read_s`` (0, 0.0:
        unknown)."""
        self.engine_stats_read_s = read_s
        if (waiting_requests, kv_usage_frac) != (self.waiting_requests, self.kv_usage_frac):
            self.waiting_requests = waiting_requests
            self.kv_usage_frac = kv_usage_frac
            self._restate()

    def _restate(self) -> None:
        self.state = self.state_with(self.in_flight_requests, self.in_flight_tokens)

    def synced_state(self, requests: int, tokens: int) -> InstanceState:
        """``state_with(requests, tokens)``, the same object as last time when nothing it holds
        changed: a snapshot then rebuilds only the instances whose load moved, and the
        strategy sees the others unchanged (the same objects)."""
        last = self.synced
        if (
            last.in_flight_requests != requests
            or last.in_flight_tokens != tokens
            or last.kv_capacity_blocks != self.kv_capacity_blocks
            or last.waiting_requests != self.waiting_requests
            or last.kv_usage_frac != self.kv_usage_frac
        ):
            last = self.synced = self.state_with(requests, tokens)
        return last

    def state_with(self, requests: int, tokens: int) -> InstanceState:
        """This instance as strategies see it, ``requests`` and ``tokens`` in flight."""
        return InstanceState(
            self.instance_id,
            requests,
            tokens,
            self.waiting_requests,
            self.kv_usage_frac,
            self.kv_capacity_blocks,
        )
