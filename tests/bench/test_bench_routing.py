"""The routing benchmark's parts measure what they say: the peer's index learns every chain
the sender's learnt, from the decoded notes alone; exact mode with and without claims makes the
same decisions when events come at once (no timing is checked)."""

from __future__ import annotations

from warmfleet.bench.routing_bench import measure_claims, measure_moving_fleet, measure_sync


def test_the_peer_learns_every_chain_the_sender_learnt() -> None:
    result = measure_sync(prompt_chars=2_000, repeats=40, seed=3)
    assert result["sender_indexed_blocks"] > 0
    assert result["peer_indexed_blocks"] == result["sender_indexed_blocks"]
    parts = ("view", "encode", "decode", "apply")
    assert all(isinstance(result[part], float) for part in parts)
    assert all(result[part] > 0 for part in ("encode", "decode", "apply"))


def test_moving_fleet_decisions_are_measured_beside_static_ones() -> None:
    result = measure_moving_fleet(prompt_chars=2_000, repeats=40, seed=3)
    assert set(result) == {"static", "moving"}
    assert all(isinstance(v, float) and v > 0 for v in result.values())


def test_claims_cost_is_measured_on_the_same_decisions() -> None:
    result = measure_claims(prompt_chars=2_000, repeats=40, seed=3)  # raises if decisions differ
    assert set(result) == {"without", "with", "added"}
    assert result["without"] > 0
    assert result["with"] > 0
