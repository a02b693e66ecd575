"""`make bench-doctor` (bench.doctor_bench): the emulator's tokenization as an HF tokenizer (so the
gateway's ``tokens`` keys cut the engines' blocks), the gateway document it runs, and a tiny
live run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warmfleet.api.trace_format import parse_trace
from warmfleet.bench import doctor_speed
from warmfleet.bench.doctor_bench import (
    bench_config,
    capture_spec,
    gateway_routing,
    record_lines,
    run_bench,
)
from warmfleet.bench.emulator_hf import write_emulator_tokenizer
from warmfleet.bench.live_demo import DemoConfig, demo_workload
from warmfleet.emulator.tokenizer import EmulatorTokenizer
from warmfleet.gateway.config import GatewayConfig
from warmfleet.gateway.tokenizer import HfChatTokenizer
from warmfleet.routing.key_modes import key_builder
from warmfleet.routing.key_spec import KeySpec
from warmfleet.routing.parse import parse_chat
from warmfleet.sim.workloads.base import render_prompt_text

TINY = DemoConfig(
    instances=2, groups=4, requests=16, prefix_words=200, question_words=20, output_tokens=4,
    concurrency=2, speedup=20.0, max_run_s=40.0,
)  # fmt: skip


def test_the_hf_tokenizer_counts_and_cuts_as_the_emulator(tmp_path: Path) -> None:
    requests = demo_workload(TINY)
    texts = [render_prompt_text(r.segments) for r in requests]
    odd = "x" * 9 + "   tail  words, with punctuation! and a longword"
    hf = HfChatTokenizer.from_dir(write_emulator_tokenizer(tmp_path, [*texts, odd]))
    emulator = EmulatorTokenizer()
    for text in [*texts, odd]:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        assert len(hf.encode_chat(messages)) == len(emulator.encode_chat(messages))
        assert len(hf.encode_prompt(text)) == len(emulator.encode_prompt(text))
    # equal blocks exactly where the emulator's are: requests of one group share their prefix
    keys = key_builder(KeySpec(mode="tokens", block_size=16), hf)

    def blocks(text: str) -> tuple[int, ...]:
        body = {"model": "m", "messages": [{"role": "user", "content": text}]}
        return keys.key(parse_chat(body)).block_hashes

    first = requests[0].segments[0]
    same = next(i for i, r in enumerate(requests) if i and r.segments[0] == first)
    other = next(i for i, r in enumerate(requests) if r.segments[0] != first)
    prefix = f"{render_prompt_text((first,))} "
    shared = len(emulator.encode_chat([{"role": "user", "content": prefix}])) // 16 - 1
    a, b, c = blocks(texts[0]), blocks(texts[same]), blocks(texts[other])
    assert shared > 4
    assert a[:shared] == b[:shared]
    assert a[-1] != b[-1]  # the last full block holds question tokens (20 words)
    assert a[0] != c[0]


def test_the_gateway_document_keys_in_engine_blocks_and_captures(tmp_path: Path) -> None:
    routing = gateway_routing("prefix_affinity", 128)
    assert routing["key"] == {"mode": "tokens", "blockSize": 128}
    spec = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "endpoints": [{"name": "e", "variants": [{"name": "v", "routing": routing,
                       "instances": [{"id": "a", "url": "http://127.0.0.1:1"}]}]}],
        **capture_spec(tmp_path / "c.jsonl", tmp_path),
    }  # fmt: skip
    config = GatewayConfig.model_validate({"apiVersion": "warmfleet.dev/v1alpha1",
                                           "kind": "Gateway", "spec": spec})  # fmt: skip
    assert config.spec.capture is not None
    assert config.spec.capture.path == str(tmp_path / "c.jsonl")


def test_record_lines_count_records_not_the_header() -> None:
    text = '{"warmfleet_trace":1,"block_tokens":128}\n{"timestamp":0,"input_length":1,' + (
        '"output_length":1}\n\n{"timestamp":1,"input_length":1,"output_length":1}\n'
    )
    assert record_lines(text) == 2
    assert len(parse_trace(text.splitlines()).records) == 2
    assert bench_config(requests=10).requests == 10


@pytest.mark.slow
@pytest.mark.e2e
async def test_a_tiny_calibration_run_writes_every_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor_speed, "RECORDS", 100)  # the timing itself: make bench-doctor
    monkeypatch.setattr(doctor_speed, "resolve_traces_dir", lambda: tmp_path / "absent")
    out = await run_bench(TINY, tmp_path / "logs", strategies=("prefix_affinity",))
    speed = out["doctor_speed"]
    assert speed["capture_records"] == 100
    assert speed["capture_10k_s"] > 0
    assert speed["mooncake_s"] is None
    row = out["strategies"]["prefix_affinity"]
    assert row["requests_answered"] == TINY.requests
    assert row["capture_lines"] == TINY.requests
    assert row["capture_dropped"] == 0
    assert 0.0 < row["live_hit_rate"] <= 1.0
    assert 0.0 < row["replay_hit_rate"] <= 1.0
    assert row["hit_rate_abs_error"] == pytest.approx(
        abs(row["replay_hit_rate"] - row["live_hit_rate"])
    )
    assert row["ttft_p50_ratio"] == pytest.approx(
        row["replay_ttft_p50_ms"] / row["live_ttft_p50_ms"]
    )
    capture = parse_trace((tmp_path / "logs" / "capture-prefix_affinity.jsonl").read_text()
                          .splitlines())  # fmt: skip
    # live TTFT is the gateway's, as the capture records it; the client's (later) beside it
    ttfts = sorted(r.ttft_ms for r in capture.records if r.ttft_ms is not None)
    assert ttfts[0] <= row["live_ttft_p50_ms"] <= ttfts[-1]
    assert row["live_client_ttft_p50_ms"] >= row["live_ttft_p50_ms"] * 0.9
    assert capture.header.block_tokens == 128  # tiny-cpu's blocks, in tokens
    assert capture.header.fleet.strategy is not None
    assert capture.header.fleet.strategy["type"] == "prefix_affinity"
    json.dumps(out)  # the document is JSON as it is
