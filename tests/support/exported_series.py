"""The series a process exports, for the tests that check the dashboard and the alert rules
against them: every series name (a counter's ``_total``, a histogram's ``_bucket``, ``_sum`` and
``_count``) and its label names, whether or not it has a sample yet."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from warmfleet.agent.metrics import CacheMetrics
from warmfleet.agent.peer_serve import PeerCounters
from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.capture import CaptureMetrics
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.flow_metrics import FlowCollector
from warmfleet.gateway.hold import GatewayHold
from warmfleet.gateway.kv_events.wiring import KvEventFeed
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.replica_sync.metrics import SyncMetrics
from warmfleet.gateway.world import GatewayState

_URL = "http://127.0.0.1:1"  # never asked
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}


_GATEWAY = {
    "apiVersion": "warmfleet.dev/v1alpha1",
    "kind": "Gateway",
    "spec": {
        "endpoints": [
            {"name": "e", "variants": [{"name": "v", "instances": [{"id": "i0", "url": _URL}]}]}
        ]
    },
}


def gateway_registry() -> CollectorRegistry:
    """A gateway's registry with every family it can export registered: its own metrics, the KV
    events feed, replica sync, flow control, capture, the zero-ready hold (``/v1/models``'
    counter is the gateway's own)."""
    metrics = GatewayMetrics()
    KvEventFeed("m").register_metrics(metrics.registry)
    SyncMetrics(metrics.registry)
    metrics.registry.register(FlowCollector(lambda: (), dict))
    CaptureMetrics(metrics.registry)
    state = GatewayState(parse_gateway_config(_GATEWAY), default_router_factory, metrics)
    GatewayHold(state, metrics.registry, lambda: 0.0)
    return metrics.registry


def node_agent_registry() -> CollectorRegistry:
    """A node agent's registry: its cache metrics and its peer-distribution counters."""
    registry = CacheMetrics().registry
    PeerCounters(registry)
    return registry


def series_labels(registry: CollectorRegistry) -> dict[str, frozenset[str]]:
    """Series name -> label names (a bucket's ``le`` included) of everything ``registry``
    exports."""
    out: dict[str, frozenset[str]] = {}
    for collector in list(registry._collector_to_names):  # every registered collector
        if isinstance(collector, MetricWrapperBase):  # its label names even with no child yet
            families, names = collector.describe(), collector._labelnames
        else:
            families, names = list(collector.collect()), None
        for family in families:
            labels = names if names is not None else getattr(family, "_labelnames", ())
            for suffix in _SUFFIXES[family.type]:
                extra = {"le"} if suffix == "_bucket" else set()
                out[family.name + suffix] = frozenset(labels) | extra
    return out
