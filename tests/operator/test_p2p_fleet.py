"""Peer distribution on the embedded fleet (agent processes, the tracker, a throttled origin):
a clean fill takes each piece from the origin once; a fill with a peer SIGKILLed mid-transfer,
a peer serving flipped bytes and a peer that stalls still completes on every node, rejects the
bad pieces and publishes no corrupt or partial copy. Small model; no timing asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.p2p_acceptance import FAULTS, fill_run

SIZE = 16_000_000
PIECE = 1 << 20


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_peer_fill_clean_then_with_faults(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "nodes": 3,
        "size_bytes": SIZE,
        "throttle_bps": SIZE,
        "piece_bytes": PIECE,
    }
    clean = await fill_run(tmp_path / "clean", peers=True, timeout_s=90, **common)
    assert clean["corrupt_or_partial_published"] == 0
    assert clean["origin_bytes_ratio"] <= 1.05
    assert clean["bytes_from_peers"] == 2 * SIZE
    assert clean["tracker"]["originFallbacks"] == 0

    faulty = await fill_run(tmp_path / "faults", peers=True, faults=FAULTS, timeout_s=150, **common)
    assert faulty["corrupt_or_partial_published"] == 0  # every node completed (else timeout)
    assert faulty["pieces_rejected"] >= 1
    assert faulty["bad_peer_requests"]["bad-flip"] >= 1
    assert faulty["bad_peer_requests"]["bad-stall"] >= 1
    assert faulty["killed_node"] == "node-c"
    # the origin only for what nobody else could give: the killed node's lost pieces at most
    assert faulty["origin_bytes_ratio"] <= 2.0
