"""The peer-distribution what-if (``sim.peer_model``) on the seed's example: 145 GB, 20 min from
S3, at 4, 20 and 100 nodes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmfleet.sim.peer_model import fill_s, peer_whatif
from warmfleet.sim.scaleout import WhatIfParams


def test_seed_example_egress_and_time() -> None:
    report = peer_whatif(WhatIfParams())
    shared = report["shared_link"]
    assert isinstance(shared, dict)
    twenty = shared["20"]
    assert twenty["origin_egress_bytes_without_peers"] == pytest.approx(2.9e12)
    assert twenty["origin_egress_bytes_with_peers"] == pytest.approx(145e9)
    assert twenty["fill_s_without_peers"] == pytest.approx(20 * 1200.0)  # the link / 20
    assert twenty["fill_s_with_peers"] == pytest.approx(1200.0)  # one copy through the link
    per_node = report["per_node_origin"]
    assert isinstance(per_node, dict)
    assert per_node["4"]["fill_s_without_peers"] == pytest.approx(1200.0)
    assert per_node["100"]["fill_s_with_peers"] < per_node["4"]["fill_s_with_peers"]
    assert set(shared) == {"4", "20", "100"}


@given(
    nodes=st.integers(1, 500),
    size=st.floats(1e6, 1e12),
    origin=st.floats(1e6, 1e10),
    peer=st.floats(1e6, 1e10),
)
def test_peers_never_slower_than_the_origin_alone(
    nodes: int, size: float, origin: float, peer: float
) -> None:
    alone = fill_s(size, nodes, origin_bps=origin, download_bps=7e9, peer_bps=None)
    shared = fill_s(size, nodes, origin_bps=origin, download_bps=7e9, peer_bps=peer)
    assert shared <= alone * (1 + 1e-9)
    assert shared >= size / origin * (1 - 1e-9)  # the origin sends one copy at least
