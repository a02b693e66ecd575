"""The load generator's figures without a server: the summary's fields match the simulator's,
spills counted for every spill reason, the usage hit rate, reasoning and tool-call deltas as
tokens, Prometheus text parsing, engine counter deltas (resets, failed scrapes) and the
rendered request bodies."""

from __future__ import annotations

import json
from typing import cast

import pytest
from bench_support import small_gsp
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.bench.loadgen import (
    LoadResult,
    LoadSpec,
    RequestResult,
    _has_content,
    prepare_requests,
)
from warmfleet.bench.loadgen_metrics import MetricsTarget, engine_delta, parse_prometheus, summarize
from warmfleet.sim.metrics import RunMetrics


def test_report_field_names_match_the_simulator() -> None:
    sim = RunMetrics(
        ttft_s=[0.1], e2e_s=[0.2], completed=1, rejected=0, submitted=1, throughput_rps=1.0,
        output_tokens_per_s=1.0, hit_rate=0.5, reuse={"delivered": 0.5}, share_pct={"a": 100.0},
        spills=0, decisions_by_reason={},
    ).as_report()  # fmt: skip

    live = summarize(LoadResult([RequestResult(0, 0.0, 0.2, 0.1)], 1, 0, 1.0))
    assert set(sim) <= set(live)
    for key, value in sim.items():
        if isinstance(value, dict) and key not in ("decisions_by_reason", "reuse"):
            assert set(value) <= set(cast(dict[str, object], live[key]))
    assert "delivered" in live["reuse"]  # type: ignore[operator]


def test_parse_prometheus_sums_label_sets() -> None:
    text = (
        "# HELP x y\n# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 10\n'
        'vllm:prefix_cache_hits_total{engine="1",note="a}b"} 5.5\n'
        "vllm:num_requests_running 3 1700000000\n"
        'h_bucket{le="+Inf"} 7\n'
        "bad line here\n"
        "nan_metric NaN\n"
    )
    parsed = parse_prometheus(text)
    assert parsed["vllm:prefix_cache_hits_total"] == 15.5
    assert parsed["vllm:num_requests_running"] == 3.0
    assert parsed["h_bucket"] == 7.0
    assert "nan_metric" not in parsed
    assert "bad" not in parsed


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300))
def test_parse_prometheus_never_raises(text: str) -> None:
    parse_prometheus(text)


def test_engine_delta_and_counter_resets() -> None:
    before = {"a": {"vllm:prefix_cache_hits_total": 5.0, "vllm:prefix_cache_queries_total": 10.0}}
    after = {
        "a": {"vllm:prefix_cache_hits_total": 8.0, "vllm:prefix_cache_queries_total": 20.0,
              "vllm:request_success_total": 4.0},
        "b": {},
    }  # fmt: skip
    delta = engine_delta(before, after)
    assert delta.hit_rate == pytest.approx(0.3)
    assert delta.requests == {"a": 4.0}
    assert delta.missing == ("b",)  # its scrape failed: unknown, said so
    assert engine_delta({}, {"a": {}}).hit_rate is None


def test_engine_delta_restart_and_failed_first_scrape() -> None:
    """A counter that went down was reset by a restart (counted from zero, not clamped to
    nothing); an instance whose first scrape failed has no baseline: its whole counter is not
    the run's."""
    hits, queries = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
    before = {"a": {hits: 50.0, queries: 100.0}, "b": {}}
    after = {"a": {hits: 3.0, queries: 10.0}, "b": {hits: 900.0, queries: 1000.0}}
    delta = engine_delta(before, after)
    assert delta.hits == {"a": 3.0}
    assert delta.queries == {"a": 10.0}
    assert delta.missing == ("b",)
    assert delta.hit_rate == pytest.approx(0.3)
    assert MetricsTarget.parse("e0=http://h:1/metrics") == MetricsTarget("e0", "http://h:1/metrics")
    assert MetricsTarget.parse("http://h:1/metrics").instance == "http://h:1/metrics"


def test_prepare_renders_the_shared_workload_text() -> None:
    requests = small_gsp(4)
    prepared = prepare_requests(requests, LoadSpec(urls=("http://x",), api="completions"))
    from warmfleet.sim.workloads.base import render_prompt_text  # noqa: PLC0415

    for req, prep in zip(requests, prepared, strict=True):
        body = json.loads(prep.body)
        assert body["prompt"] == render_prompt_text(req.segments)
        assert prep.path == "/v1/completions"


def test_spills_count_every_spill_reason_like_the_simulator() -> None:
    """The simulator counts decisions with ``spilled`` (prefix_hash overflow and
    prefix_affinity replicate); the live summary must count both reasons too."""

    results = []
    for index, reason in enumerate(["replicate", "overflow", "prefix_hit", "replicate"]):
        result = RequestResult(index, 0.0, 0.2, 0.1)
        result.instance, result.reason = "a", reason
        results.append(result)
    summary = summarize(LoadResult(results, 4, 0, 1.0))
    assert summary["spills"] == 3
    assert summary["decisions_by_reason"] == {"overflow": 1, "prefix_hit": 1, "replicate": 2}


def test_usage_hit_rate_counts_a_missing_cached_tokens_as_zero_once_any_is_reported() -> None:
    """vLLM (--enable-prompt-tokens-details) leaves ``cached_tokens`` out when nothing was
    cached: those requests hit 0 tokens and must weigh in, not vanish from the rate. With no
    answer carrying it at all, the rate is unknown."""
    hit = RequestResult(0, 0.0, e2e_s=0.1, prompt_tokens=100, cached_tokens=80)
    miss = RequestResult(1, 0.0, e2e_s=0.1, prompt_tokens=100, cached_tokens=None)
    summary = summarize(LoadResult([hit, miss], submitted=2, not_sent=0, wall_s=1.0))
    assert summary["hit_rate"] == pytest.approx(0.4)
    assert summary["hit_rate_source"] == "usage_cached_tokens"
    none = summarize(LoadResult([miss], submitted=1, not_sent=0, wall_s=1.0))
    assert (none["hit_rate"], none["hit_rate_source"]) == (0.0, "unknown")


def test_reasoning_and_tool_call_deltas_are_tokens() -> None:
    """A reasoning model streams its thinking first (vLLM: delta.reasoning_content, newer
    delta.reasoning) and a tool call streams delta.tool_calls: those are generated tokens, so
    TTFT is not pushed back to the first visible answer token."""
    role_only = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    usage_only = {"choices": [], "usage": {"completion_tokens": 3}}
    assert not _has_content(role_only)
    assert not _has_content(usage_only)
    for delta in (
        {"content": "Hi"},
        {"reasoning_content": "Let me think"},
        {"reasoning": "Let me think"},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
    ):
        assert _has_content({"choices": [{"index": 0, "delta": delta}]}), delta
    assert _has_content({"choices": [{"index": 0, "text": "Hi"}]})  # completions
