"""The header line of a capture file (docs/trace-format.md): the block size and the fleet of
the default endpoint's first variant, as the gateway sees them when the file is opened."""

from __future__ import annotations

import logging

from warmfleet.api.trace_format import TraceFleet, TraceHeader, header_line
from warmfleet.core.errors import WarmfleetError
from warmfleet.gateway.world import GatewayState

log = logging.getLogger(__name__)


def capture_header(state: GatewayState) -> str:
    """``block_tokens``: the variant's key block size (in key units: tokens in ``tokens``
    mode, characters or bytes in ``text``/``bytes`` modes); ``fleet``: its routable instances,
    its strategy document and the KV capacity per instance when the instances report one.
    Records name their variant, so a capture of several variants stays readable."""
    try:
        variant = next(iter(state.default_endpoint().variants.values()))
    except (WarmfleetError, StopIteration):
        return header_line(TraceHeader())
    routing = variant.routing_config
    block = routing.key.effective_block_size
    capacities = [i.state.kv_capacity_blocks for i in variant.routable]
    capacity = min(capacities) * block if capacities and min(capacities) > 0 else None
    fleet = TraceFleet(
        instances=len(variant.routable) or None,
        kv_capacity_tokens=capacity,
        strategy=routing.strategy.model_dump(mode="json", by_alias=True),
    )
    return header_line(TraceHeader(block_tokens=block, fleet=fleet))
