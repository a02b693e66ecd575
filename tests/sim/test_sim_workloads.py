"""Workload generators and trace loaders (small slices of the real traces in ../shared/traces)."""

from __future__ import annotations

import itertools
import json
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.errors import ConfigError
from warmfleet.engine.presets import get_preset
from warmfleet.sim.scenario import (
    build_workload,
    builtin_scenario,
    parse_scenario,
    replays_trace,
    trace_path,
)
from warmfleet.sim.workloads.arrivals import (
    ClosedLoopArrival,
    GammaArrival,
    PoissonArrival,
    apply_arrivals,
    scale_to_rate,
)
from warmfleet.sim.workloads.base import PrefixBlockHasher, Segment, WorkloadRequest, prompt_blocks
from warmfleet.sim.workloads.synthetic import (
    AwsLongContextConfig,
    GspConfig,
    MultiRoundQaConfig,
    aws_long_context,
    gsp,
    multi_round_qa,
)
from warmfleet.sim.workloads.traces import (
    DEFAULT_TRACES,
    MooncakeConfig,
    ShareGptReplayConfig,
    Trace,
    azure,
    mooncake,
    sharegpt_replay,
    text_segments,
)

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def _trace(name: str) -> Path:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"trace {path} is absent (expected in ../shared/traces from the repo root)")
    return path


def _read(path: Path) -> Trace:
    """What the CLI edge hands the trace parsers: the file's text and its name."""
    return Trace(path.read_text(encoding="utf-8"), str(path))


def _head(src: Path, tmp_path: Path, lines: int) -> Path:
    out = tmp_path / src.name
    with src.open(encoding="utf-8") as handle:
        out.write_text("".join(itertools.islice(handle, lines)), encoding="utf-8")
    return out


def test_mooncake_slice(tmp_path: Path) -> None:
    src = _trace("mooncake_conversation_first30min.jsonl")
    path = _head(src, tmp_path, 300)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    requests = mooncake(_read(path), seed=0)
    assert len(requests) == 300
    by_id = {r.request_id: r for r in requests}
    for index, row in enumerate(rows):
        req = by_id[index]
        assert req.prompt_tokens == row["input_length"]
        assert req.output_tokens == row["output_length"]
        assert [s.content_id for s in req.segments] == row["hash_ids"]
        assert len(prompt_blocks(req.segments, 512, 1)) == row["input_length"] // 512
        # arrivals spread within the ~3 s bucket that starts at the trace timestamp
        assert row["timestamp"] / 1e3 <= req.arrival_s <= row["timestamp"] / 1e3 + 3.01
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)
    assert mooncake(_read(path), seed=0) == requests
    assert mooncake(_read(path), seed=1) != requests


def test_mooncake_shared_hash_ids_share_block_hashes(tmp_path: Path) -> None:
    path = _head(_trace("mooncake_conversation_first30min.jsonl"), tmp_path, 50)
    requests = sorted(mooncake(_read(path), seed=0), key=lambda r: r.request_id)
    a, b = requests[0], requests[1]  # both start with hash id 0, then differ
    ha, hb = prompt_blocks(a.segments, 512, 9), prompt_blocks(b.segments, 512, 9)
    assert ha[0] == hb[0]
    assert ha[1] != hb[1]


def test_azure_slice(tmp_path: Path) -> None:
    path = _head(_trace("azure_llm_2023_conv.csv"), tmp_path, 201)
    requests = azure(_read(path), seed=0)
    assert len(requests) == 200
    assert requests[0].arrival_s == 0.0
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(requests))
    assert len({r.segments[0].content_id for r in requests}) == 200  # no prefix information


def test_sharegpt_replay_shares_prefixes_of_the_same_conversation(tmp_path: Path) -> None:
    src = _trace("text/lmbenchmark_sharegpt_run.json")
    items = json.loads(src.read_text(encoding="utf-8"))[:60]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(items), encoding="utf-8")
    requests = sharegpt_replay(_read(path), ShareGptReplayConfig(), seed=0)
    assert len(requests) == 60
    sessions = {r.session_id for r in requests}
    assert len(sessions) < 60  # several turns per conversation
    for session in sessions:
        turns = [r for r in requests if r.session_id == session]
        for a, b in itertools.pairwise(turns):
            shared = 0
            for x, y in zip(a.segments, b.segments, strict=False):
                if x != y:
                    break
                shared += 1
            assert shared >= 1


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_text_segments_equal_prefix_equal_segments(prefix: str, rest: str) -> None:
    a = text_segments(prefix * 2, 4.0, 16, 5)
    b = text_segments(prefix * 2 + rest, 4.0, 16, 5)
    full = len(prefix * 2) // 64
    assert a[:full] == b[:full]


def test_aws_long_context_picks_groups_for_the_working_set_ratio() -> None:
    spec = get_preset("llama-3.1-70b-p5")
    config = AwsLongContextConfig(working_set_ratio=4.0, requests=500)
    requests = aws_long_context(config, spec.kv_capacity_tokens, seed=0)
    prefixes = {r.segments[0].content_id for r in requests}
    expected_groups = round(4.0 * spec.kv_capacity_tokens / 8000)
    assert len(prefixes) <= expected_groups
    assert len(prefixes) > expected_groups * 0.4
    assert all(r.prompt_tokens == 8200 for r in requests)
    assert len({r.segments[1].content_id for r in requests}) == 500


def test_gsp_defaults() -> None:
    requests = gsp(GspConfig(), seed=0)
    assert len(requests) == 64 * 16
    assert len({r.segments[0].content_id for r in requests}) == 64
    assert {r.prompt_tokens for r in requests} == {2048 + 128}
    firsts = [r.segments[0].content_id for r in requests[:16]]
    assert len(set(firsts)) > 1  # shuffled, not grouped


def test_multi_round_qa_history_grows_and_includes_answers() -> None:
    config = MultiRoundQaConfig(users=3, rounds=4)
    requests = multi_round_qa(config, seed=0)
    assert len(requests) == 12
    for user in range(3):
        turns = [r for r in requests if r.session_id == user]
        for a, b in itertools.pairwise(turns):
            assert b.segments[: len(a.segments)] == a.segments
            assert (
                b.prompt_tokens == a.prompt_tokens + config.answer_tokens + config.question_tokens
            )
    system = {r.segments[0] for r in requests}
    assert len(system) == 1


def test_prefix_block_hasher_equals_prompt_blocks() -> None:
    rng = random.Random(3)
    hasher = PrefixBlockHasher(32, 11)
    for _ in range(200):
        segments = tuple(
            Segment(rng.randrange(5), rng.randrange(1, 90)) for _ in range(rng.randrange(6))
        )
        assert hasher.blocks(segments) == prompt_blocks(segments, 32, 11)


def test_prefix_block_hasher_memory_is_linear_in_a_prompts_segments() -> None:
    """A prompt of one-block segments (a Mooncake row: one per hash id) is remembered at each
    segment's end; those states share the prompt's blocks (a copy each: 2,000 blocks would be
    ~16 MB, quadratic)."""
    segments = tuple(Segment(i, 32) for i in range(2_000))
    hasher = PrefixBlockHasher(32, 11)
    tracemalloc.start()
    try:
        blocks = hasher.blocks(segments)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert blocks == prompt_blocks(segments, 32, 11)
    assert peak_bytes < 4 << 20
    assert hasher.blocks(segments[:1_500]) == blocks[:1_500]  # resumed from a state


def _requests(count: int) -> list[WorkloadRequest]:
    return [WorkloadRequest(i, float(i), (Segment(i, 10),), 5) for i in range(count)]


def test_arrival_processes() -> None:
    rng = random.Random(0)
    poisson = apply_arrivals(_requests(2000), PoissonArrival(rate_rps=10.0), rng)
    assert poisson[-1].arrival_s == pytest.approx(200.0, rel=0.1)
    gamma = apply_arrivals(_requests(2000), GammaArrival(rate_rps=10.0, cv=3.0), rng)
    assert gamma[-1].arrival_s == pytest.approx(200.0, rel=0.35)
    closed = apply_arrivals(_requests(5), ClosedLoopArrival(concurrency=2), rng)
    assert [r.arrival_s for r in closed] == [0.0] * 5
    scaled = scale_to_rate(_requests(101), 4.0)
    assert scaled[-1].arrival_s == pytest.approx(101 / 4.0)


def test_builtin_scenarios_build(tmp_path: Path) -> None:
    spec = get_preset("llama-3.1-70b-p5")
    for name in ("aws-long-context", "gsp", "multi-round-qa"):
        scenario = builtin_scenario(name, 7, "llama-3.1-70b-p5", 0).model_copy(
            update={"requests": 40}
        )
        built = build_workload(scenario, spec)
        assert len(built.requests) == 40
        assert built.block_tokens == spec.block_tokens
    path = _head(_trace("mooncake_conversation_first30min.jsonl"), tmp_path, 100)
    built = build_workload(
        builtin_scenario("mooncake", 8, "llama-3.1-70b-p5", 0), spec, trace=_read(path)
    )
    assert built.block_tokens == 512
    assert len(built.requests) == 100


def test_trace_scenarios_name_their_file_and_replay_what_the_edge_read(tmp_path: Path) -> None:
    """The workload code opens no file and guesses no location: ``trace_path`` names the file
    (``--trace``, else ``workload.trace``, else the default file in the traces directory the CLI
    resolved) and ``build_workload`` replays the text the edge read from it."""
    mooncake_scenario = builtin_scenario("mooncake", 8, "llama-3.1-70b-p5", 0)
    gsp_scenario = builtin_scenario("gsp", 8, "llama-3.1-70b-p5", 0)
    assert replays_trace(mooncake_scenario)
    assert not replays_trace(gsp_scenario)
    given = tmp_path / "given.jsonl"
    default = tmp_path / DEFAULT_TRACES["mooncake"]
    assert trace_path(mooncake_scenario, given, tmp_path) == given
    assert trace_path(mooncake_scenario, None, tmp_path) == default
    configured = mooncake_scenario.model_copy(update={"workload": MooncakeConfig(trace=str(given))})
    assert trace_path(configured, None, None) == given
    with pytest.raises(ConfigError, match="no traces directory"):
        trace_path(mooncake_scenario, None, None)
    with pytest.raises(ConfigError, match="no default trace"):
        trace_path(gsp_scenario, None, tmp_path)
    spec = get_preset("llama-3.1-70b-p5")
    short = mooncake_scenario.model_copy(update={"requests": 40})
    equivalent = build_workload(short, spec)  # no trace read: the synthetic equivalent
    assert len(equivalent.requests) == 40
    assert equivalent.source.startswith("synthetic equivalent of " + DEFAULT_TRACES["mooncake"])
    row = {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
    text = "".join(json.dumps(row) + "\n" for _ in range(5))
    built = build_workload(mooncake_scenario, spec, trace=Trace(text, "inline"))
    assert len(built.requests) == 5
    assert built.source == "trace inline"
    assert build_workload(gsp_scenario.model_copy(update={"requests": 4}), spec).source == (
        "generated"
    )


def test_scenario_yaml_roundtrip_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: Scenario\nname: mine\n"
        "workload: {type: gsp, groups: 4, promptsPerGroup: 2}\n"
        "arrival: {type: gamma, rateRps: 3, cv: 2}\ninstances: 2\npreset: tiny-cpu\n"
        "engine: {maxNumSeqs: 4}\nscaleEvents: [{atS: 1, action: add}]\n",
        encoding="utf-8",
    )
    scenario = parse_scenario(good.read_text(encoding="utf-8"), str(good))
    assert scenario.workload.type == "gsp"
    assert scenario.engine.max_num_seqs == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: Scenario\nname: x\n"
        "workload: {type: gsp, groups: 0}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"workload\.gsp\.groups"):
        parse_scenario(bad.read_text(encoding="utf-8"), str(bad))
    with pytest.raises(ConfigError, match="unknown scenario"):
        builtin_scenario("nope", 1, "tiny-cpu", 0)


def test_azure_timestamps_offsets_and_local_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure's 2024 traces write ``+00:00`` offsets and sometimes no fraction; the trace's clock
    is UTC whatever the machine's time zone (here one with a DST jump inside the trace)."""
    import time  # noqa: PLC0415

    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-03-10 01:59:59.500000+00:00,10,2\n"
        "2024-03-10 03:00:00+00:00,20,3\n"
        "2024-03-10 03:00:01.25,30,4\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        requests = azure(_read(path), seed=0)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [r.arrival_s for r in requests] == [0.0, 3600.5, 3601.75]
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.csv:2"):
        azure(_read(bad), seed=0)


def test_mooncake_odd_rows(tmp_path: Path) -> None:
    """Prompt length is ``input_length`` even when ``hash_ids`` does not hold exactly
    ceil(input_length / 512) ids; a malformed line is a ConfigError naming it."""
    path = tmp_path / "odd.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 100, "hash_ids": [7, 8], "output_length": 1},
        {"timestamp": 3000, "input_length": 1100, "hash_ids": [7], "output_length": 2},
        {"timestamp": 3000, "input_length": 1024, "hash_ids": [7, 9], "output_length": 3},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    requests = sorted(
        mooncake(_read(path), seed=0, spread_buckets=False), key=lambda r: r.request_id
    )
    assert [r.prompt_tokens for r in requests] == [100, 1100, 1024]
    assert [s.content_id for s in requests[2].segments] == [7, 9]
    blocks = [prompt_blocks(r.segments, 512, 1) for r in requests]
    assert len(blocks[1]) == 2
    assert blocks[1][0] == blocks[2][0]  # block 0 shared (id 7)
    assert blocks[1][1] != blocks[2][1]  # the id-less tail is its own content
    for line in ('{"timestamp": 0}', "[1, 2]"):
        path.write_text(json.dumps(rows[0]) + "\n" + line + "\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=r"odd\.jsonl:2"):
            mooncake(_read(path), seed=0)
