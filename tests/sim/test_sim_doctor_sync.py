"""`warmfleet doctor`'s replica-sync traffic: the notes of a trace's requests, encoded as the live
gateway encodes them, at the trace's rate, for the replicas asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from support.doctor_captures import capture_lines, write_capture
from warmfleet.api.replica_sync import DEFAULT_LOG_BYTES, BatchEncoder, decode_batch
from warmfleet.api.trace_format import TraceRecord
from warmfleet.bench import doctor_cli
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.gateway.replica_sync.config import ReplicaSyncConfig
from warmfleet.routing.replica_notes import RoutedNote, finished_note, routed_note
from warmfleet.sim.doctor_sync import NAMES, HitReuse, SyncTraffic, hit_reuse, sync_traffic
from warmfleet.sim.workloads.base import Segment, WorkloadRequest

app = typer.Typer()
doctor_cli.register(app)
app.command("noop")(lambda: None)  # two commands: `doctor` stays a subcommand


def _request(index: int, at_s: float) -> WorkloadRequest:
    return WorkloadRequest(index, at_s, (Segment(index, 1000),), 64)


def _key(blocks: int, first: int = 1) -> RoutingKey:
    hashes = tuple(range(first << 40, (first << 40) + blocks))
    return RoutingKey(hashes, 16, blocks * 16, blocks * 16, 7, 64, 11, None)


def test_a_routing_note_weighs_eight_bytes_a_block_more() -> None:
    keys = [_key(40), _key(100), _key(2048), _key(3000)]
    traffic = sync_traffic([_request(i, float(i)) for i in range(4)], keys, replicas=2)
    small, large, capped, over = traffic.routed_bytes
    assert large - small == 8 * 60
    assert over == capped  # a live key carries 2,048 hashes at most
    # (counts past 127 take msgpack a byte or two more)
    assert 8 * (2048 - 100) <= capped - large <= 8 * (2048 - 100) + 8


def test_the_counted_note_is_the_one_the_wire_carries() -> None:
    key = _key(100)
    traffic = sync_traffic([_request(0, 0.0)], [key], replicas=2)
    encoder = BatchEncoder()
    envelope = len(encoder.encode([]))
    origin, variant, instance = NAMES
    blocks = len(key.block_hashes)
    decision = Decision(instance, Reason.PREFIX_HIT, blocks, blocks)
    routed = routed_note(origin, variant, 1, key, decision)
    payloads = [encoder.encode([n]) for n in (routed, finished_note(routed))]
    assert traffic.routed_bytes == (len(payloads[0]) - envelope,)
    assert traffic.finished_bytes == len(payloads[1]) - envelope
    decoded = decode_batch(payloads[0])[0]
    assert isinstance(decoded, RoutedNote)
    assert decoded.key.block_hashes == key.block_hashes


def test_rates_follow_the_trace_and_the_replicas() -> None:
    requests = [_request(i, 2.0 * i) for i in range(10)]  # 18 s
    keys = [_key(50 + i, first=i + 1) for i in range(10)]
    traffic = sync_traffic(requests, keys, replicas=4)
    four, one = traffic.report(), sync_traffic(requests, keys, replicas=1).report()
    total = sum(traffic.routed_bytes) + traffic.finished_bytes
    assert four["fleet_bytes_per_s"] == pytest.approx(total / 18.0)
    assert four["fleet_notes_per_s"] == pytest.approx(20 / 18.0)
    assert four["replica_bytes_per_s"] == pytest.approx(total / 18.0 * 3 / 4)
    assert one["replica_bytes_per_s"] == 0.0
    assert four["log_horizon_s"] == pytest.approx(DEFAULT_LOG_BYTES / (total / 18.0))
    assert four["log_requests"] == pytest.approx(DEFAULT_LOG_BYTES / (total / 10))
    instant = sync_traffic(requests[:1], keys[:1], replicas=4).report()
    assert instant["fleet_bytes_per_s"] is None
    assert instant["log_horizon_s"] is None
    with pytest.raises(ValueError, match="replicas"):
        sync_traffic(requests, keys, replicas=0)


def test_a_hits_reuse_gap_runs_to_its_prefixs_last_routing_on_its_instance() -> None:
    a, b, c = (1, 2, 3), (1, 2, 4), (9, 8)
    hashes = [a, c, b, a, c, (1, 5)]
    arrivals = [0.0, 1.0, 3.0, 10.0, 11.0, 12.0]
    instances = ["x", "y", "x", "x", "", "y"]  # the fifth was not served
    cached = [0, 0, 32, 48, 16, 16]  # 16 tokens a block
    reuse = hit_reuse(arrivals, hashes, 16, cached, instances)
    # b's 2 blocks on x: last routed with a at 0.0 (3 s); a on x: block 3 last at 0.0, not the
    # shallower block 2 b touched at 3.0 (10 s); (1, 5) on y: block 1 was never routed there
    assert reuse == HitReuse((3.0, 10.0), (32, 48))
    assert reuse.quantile(0.5) == 10.0  # weighted by hit tokens: 32 of 80 under 3 s
    assert reuse.quantile(0.4) == 3.0
    assert reuse.covered(5.0) == pytest.approx(32 / 80)
    assert HitReuse((), ()).quantile(0.99) is None
    with pytest.raises(ValueError, match="a request"):
        hit_reuse(arrivals, hashes, 16, cached, instances[:-1])
    assert HitReuse((), ()).covered(1.0) is None


def test_the_report_says_what_log_covers_the_hits() -> None:
    requests = [_request(i, 2.0 * i) for i in range(10)]  # 18 s
    keys = [_key(50, first=1) for _ in range(10)]
    reuse = HitReuse((1.0, 4.0, 30.0), (10, 80, 10))
    # 2.5 logs' worth of notes in 18 s: the log holds 7.2 s of this traffic
    doc = SyncTraffic(18.0, (DEFAULT_LOG_BYTES // 4,) * 10, 0, 2, reuse).report()
    assert doc["log_horizon_s"] == pytest.approx(7.2)
    assert doc["hit_reuse_gap_s"] == {"p50": 4.0, "p90": 4.0, "p99": 30.0}
    assert doc["log_covers_hit_tokens"] == pytest.approx(0.9)
    assert doc["log_bytes_for_p99"] == round(DEFAULT_LOG_BYTES * 10 / 4 / 18.0 * 30.0)
    bare = sync_traffic(requests, keys, replicas=2).report()
    assert bare["log_covers_hit_tokens"] is None
    assert bare["log_bytes_for_p99"] is None


def _doctor(trace: Path, *args: str, fmt: str = "json") -> str:
    result = CliRunner().invoke(app, ["doctor", str(trace), *args, "--format", fmt])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_doctor_reports_a_captures_sync_traffic(tmp_path: Path) -> None:
    lines = capture_lines(400, rate_rps=4.0)
    trace = tmp_path / "capture.jsonl"
    write_capture(trace, lines)
    records = [TraceRecord.model_validate_json(line) for line in lines[1:]]
    blocks = sum(len(r.hash_ids) for r in records) / len(records)
    doc: dict[str, Any] = json.loads(_doctor(trace, "--gateway-replicas", "4"))
    # by default the replicas sync at the live gateway's batch interval
    assert doc["fleet"]["sync_delay_ms"] == ReplicaSyncConfig().batch_interval_ms
    sync = doc["replica_sync"]
    # 8 bytes a block, plus the note's other fields (names, counts, a session hash)
    assert 8 * blocks < sync["routed_note_bytes"]["mean"] < 8 * blocks + 160
    span_s = (max(r.timestamp for r in records) - min(r.timestamp for r in records)) / 1000.0
    assert sync["fleet_notes_per_s"] == pytest.approx(2 * len(records) / span_s)
    text = _doctor(trace, "--gateway-replicas", "4", fmt="table")
    assert "replica sync: " in text
    assert "into and out of each of the 4 replicas" in text
    hits = sync["log_covers_hit_tokens"]
    assert 0.0 < hits <= 1.0  # the capture's conversations hit the cache
    assert "of the replay's hit tokens (99 % reuse a prefix routed within" in text
    assert sync["hit_reuse_gap_s"]["p50"] <= sync["hit_reuse_gap_s"]["p99"] <= span_s
    for args in ((), ("--gateway-replicas", "4", "--sync-delay-ms", "none")):
        assert "replica sync: " not in _doctor(trace, *args, fmt="table")
