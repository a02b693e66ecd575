"""What-if of peer distribution: origin egress and time to fill N nodes, with and without peers.

A fluid model, not a packet simulation: with peers, the time to put ``F`` bytes on ``N`` nodes
is at least the Kumar-Ross minimum distribution time (R. Kumar and K. W. Ross, "Peer-assisted
file distribution: the minimum distribution time", IEEE HotWeb 2006)::

    T = max(F / u_s, F / d, N * F / (u_s + N * u))

where ``u_s`` is what the origin can send (one copy of each piece, ``k`` = 1, spread over the
nodes), ``d`` a node's download rate (its disk: NVMe) and ``u`` the upload each node gives its
peers (the agent's serving cap, so its own engine is not starved). rarest-piece-first with
fan-out comes close to the bound when pieces are small against the model (the live benchmark,
``make bench-fleet``, measures how close at 6 nodes). Without peers every node pulls all of
``F`` from the origin at once: ``T = F / min(r, L / N)`` and ``N * F`` of egress.

Two origins are modelled: ``shared_link`` (the fleet reaches the origin through one link whose
rate ``L`` is the seed's figure, 145 GB in 20 min: the link divided N ways) and
``per_node_origin`` (each node gets that rate from the origin whatever N is: the origin scales;
then with peers the origin can send ``N`` distinct pieces at once, ``u_s = N * r``).
Time to capacity adds a cached replica's start (image from the node cache, weights from NVMe,
engine init: ``WhatIfParams.start_s(True, True)``) to the time the last node holds the weights.
"""

from __future__ import annotations

from warmfleet.sim.scaleout import WhatIfParams


def fill_s(
    model_bytes: float,
    nodes: int,
    *,
    origin_bps: float,
    download_bps: float,
    peer_bps: float | None,
    k: int = 1,
) -> float:
    """Seconds until every node holds the model. ``origin_bps``: what the origin sends the
    fleet in all; ``peer_bps`` None: no peers (every node pulls it all from the origin)."""
    if peer_bps is None:
        return model_bytes / min(origin_bps / nodes, download_bps)
    from_origin = k * model_bytes / origin_bps
    spread = nodes * model_bytes / (origin_bps / k + nodes * peer_bps)
    return max(from_origin, model_bytes / download_bps, spread)


def _case(params: WhatIfParams, nodes: int, origin_bps: float) -> dict[str, float]:
    f, start_s, k = params.model_bytes, params.start_s(True, True), params.origin_fetches
    plain = fill_s(f, nodes, origin_bps=origin_bps, download_bps=params.nvme_bytes_per_s,
                   peer_bps=None)  # fmt: skip
    shared = fill_s(f, nodes, origin_bps=origin_bps, download_bps=params.nvme_bytes_per_s,
                    peer_bps=params.peer_serve_bytes_per_s, k=k)  # fmt: skip
    return {
        "origin_egress_bytes_without_peers": nodes * f,
        "origin_egress_bytes_with_peers": min(k, nodes) * f,
        "fill_s_without_peers": round(plain, 1),
        "fill_s_with_peers": round(shared, 1),
        "time_to_capacity_s_without_peers": round(plain + start_s, 1),
        "time_to_capacity_s_with_peers": round(shared + start_s, 1),
        "speedup": round(plain / shared, 2),
    }


def peer_whatif(params: WhatIfParams) -> dict[str, object]:
    """The figures for ``params.fleet_sizes`` under both origin models (JSON-ready)."""
    rate, sizes = params.origin_bytes_per_s, params.fleet_sizes
    return {
        "model": "Kumar-Ross minimum distribution time (fluid); no peers: N pulls of the model",
        "params": {
            "model_bytes": params.model_bytes,
            "origin_bytes_per_s": round(rate),
            "node_download_bytes_per_s": params.nvme_bytes_per_s,
            "peer_serve_bytes_per_s": params.peer_serve_bytes_per_s,
            "origin_fetches": params.origin_fetches,
            "replica_start_cached_s": round(params.start_s(True, True), 1),
        },
        "shared_link": {str(n): _case(params, n, rate) for n in sizes},
        "per_node_origin": {str(n): _case(params, n, n * rate) for n in sizes},
    }
