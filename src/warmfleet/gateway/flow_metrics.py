"""The flow-control series read from the gates at scrape time (``gateway.flow``): queue depth
per (band, tenant) -- the demand the autoscaler reads (``control.load``) --, sheds by reason,
served prompt tokens, cancellations and the TTFT predictor's calibration. Tenant labels are the
configured tenants and ``other`` (bounded label sets); every configured flow has a depth sample,
0 when empty. A gate replaced by a reload keeps counting until idle, then its counts leave (a
counter reset); a removed variant's cancellations go with its other series
(``GatewayFlow.forget_variant``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from warmfleet.flow.gate import FlowGate

VariantKey = tuple[str, str]  # (endpoint, variant)
# Every gate with its variant and whether it is the variant's current one (else retired)
Gates = Callable[[], Iterable[tuple[VariantKey, FlowGate, bool]]]


class FlowCollector:
    """Queue depth, sheds, served tokens and cancellations, read from the gates at scrape time
    (every flow: configured tenants by name, every other tenant as ``other``)."""

    def __init__(self, gates: Gates, cancelled: Callable[[], Mapping[VariantKey, int]]) -> None:
        self.gates = gates
        self.cancelled = cancelled

    def collect(self) -> Iterator[Metric]:
        flow_labels = ("endpoint", "variant", "band", "tenant")
        depth = GaugeMetricFamily(
            "warmfleet_gateway_flow_queued_requests",
            "Requests waiting in the flow-control queue (demand: read by the autoscaler)",
            labels=flow_labels,
        )
        shed = CounterMetricFamily(
            "warmfleet_gateway_flow_shed",
            "Requests answered 429/503 by flow control, by reason (shed, deadline)",
            labels=(*flow_labels, "reason"),
        )
        tokens = CounterMetricFamily(
            "warmfleet_gateway_flow_served_prompt_tokens",
            "Prompt tokens of the requests flow control dispatched",
            labels=flow_labels,
        )
        factor = GaugeMetricFamily(
            "warmfleet_gateway_flow_ttft_calibration",
            "The TTFT predictor's calibration factor (observed / engine-model TTFT)",
            labels=("endpoint", "variant"),
        )
        depths: dict[tuple[str, ...], float] = {}
        sheds: dict[tuple[str, ...], float] = {}
        served: dict[tuple[str, ...], float] = {}
        for where, gate, current in self.gates():
            for band in range(len(gate.config.bands)):
                for tenant in (*gate.config.tenants, "other"):
                    depths.setdefault((*where, gate.band_name(band), tenant), 0.0)
            for (band_name, tenant), n in gate.queue_depths().items():
                depths[(*where, band_name, tenant)] += n
            for (band_name, tenant, reason), n in gate.shed_count.items():
                shed_key = (*where, band_name, tenant, str(reason))
                sheds[shed_key] = sheds.get(shed_key, 0.0) + n
            for (band_name, tenant), n in gate.served_tokens.items():
                flow_key = (*where, band_name, tenant)
                served[flow_key] = served.get(flow_key, 0.0) + n
            if current:
                factor.add_metric(list(where), gate.predictor.factor)
        for family, values in ((depth, depths), (shed, sheds), (tokens, served)):
            for labels, value in sorted(values.items()):
                family.add_metric(list(labels), value)
        cancelled = CounterMetricFamily(
            "warmfleet_gateway_flow_cancelled",
            "Queued requests whose client left before they started",
            labels=("endpoint", "variant"),
        )
        for where, n in sorted(self.cancelled().items()):
            cancelled.add_metric(list(where), n)
        yield from (depth, shed, tokens, factor, cancelled)

    def describe(self) -> Iterator[Metric]:
        return iter(())
