"""Oversized or malformed workload inputs are refused, naming the field, before any work: a
generated workload's counts and token lengths, an Azure row's token counts, a ShareGPT run's
items, the what-if's parameters. A generated workload builds only the requests a run keeps."""

from __future__ import annotations

from typing import Any

import pytest

from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.engine.presets import get_preset
from warmfleet.sim.scenario import build_workload, engine_spec, parse_scenario
from warmfleet.sim.whatif import WhatIfParams, calibrate
from warmfleet.sim.workloads import synthetic
from warmfleet.sim.workloads.base import WorkloadRequest
from warmfleet.sim.workloads.traces import ShareGptReplayConfig, Trace, azure, sharegpt_replay

_HEAD = "apiVersion: warmfleet.dev/v1alpha1\nkind: Scenario\nname: big\n"


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ("{type: gsp, groups: 1000000000, promptsPerGroup: 1000000}", "workload.gsp.groups"),
        ("{type: gsp, systemPromptTokens: 1000000000000}", "workload.gsp.systemPromptTokens"),
        ("{type: gsp, groups: 100000, promptsPerGroup: 100}", "groups x promptsPerGroup"),
        ("{type: multi-round-qa, users: 10000, rounds: 1000}", "users x rounds"),
        ("{type: multi-round-qa, rounds: 100000}", "workload.multi-round-qa.rounds"),
        ("{type: aws-long-context, requests: 100000000}", "workload.aws-long-context.requests"),
        ("{type: aws-long-context, prefixTokens: 1000000000000}", "prefixTokens"),
    ],
)
def test_oversized_generated_workloads_are_rejected_at_load(workload: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_scenario(f"{_HEAD}workload: {workload}\n", "big.yaml")


def test_instances_are_bounded() -> None:
    with pytest.raises(ConfigError, match="instances: Input should be less than or equal to 10000"):
        parse_scenario(f"{_HEAD}workload: {{type: gsp}}\ninstances: 10001\n", "big.yaml")


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the requests the generators build (one entry per WorkloadRequest made)."""
    made: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> WorkloadRequest:
        made.append(1)
        return WorkloadRequest(*args, **kwargs)

    monkeypatch.setattr(synthetic, "WorkloadRequest", counted)
    return made


@pytest.mark.parametrize(
    "workload",
    [
        "{type: gsp, groups: 200, promptsPerGroup: 50}",
        "{type: multi-round-qa, users: 100, rounds: 20}",
        "{type: aws-long-context, requests: 10000}",
    ],
)
def test_a_generated_workload_builds_only_the_requests_kept(
    workload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``requests: 5``: five requests are made, the first five of the whole workload."""
    whole_doc = f"{_HEAD}workload: {workload}\npreset: tiny-cpu\n"
    whole_spec = parse_scenario(whole_doc, "s.yaml")
    whole = build_workload(whole_spec, engine_spec(whole_spec)).requests
    made = _counting(monkeypatch)
    spec = parse_scenario(f"{whole_doc}requests: 5\n", "s.yaml")
    kept = build_workload(spec, engine_spec(spec)).requests
    assert len(made) == 5
    assert [r.segments for r in kept] == [r.segments for r in whole[:5]]
    assert [r.request_id for r in kept] == [r.request_id for r in whole[:5]]


@pytest.mark.parametrize(
    ("row", "field"),
    [("1000000000000,10", "ContextTokens"), ("100,1000000000000", "GeneratedTokens")],
)
def test_an_azure_row_out_of_range_names_its_line_and_column(row: str, field: str) -> None:
    text = f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{row}\n"
    with pytest.raises(ConfigError, match=f"az.csv:2: {field}: .* out of range"):
        azure(Trace(text, "az.csv"), 0)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"a": 1}', "not a JSON list"),
        ("[1]", "item 0: not an object"),
        ('[{"input": "x", "output_length": 3}, {"input": "y"}]', "item 1: no output_length"),
        ('[{"output_length": 3}]', "item 0: no input"),
        ('[{"input": 3, "output_length": 3}]', "item 0: input: not a string"),
        ('[{"input": "x", "output_length": "many"}]', "item 0: output_length: not an integer"),
        ('[{"input": "x", "output_length": true}]', "item 0: output_length: not an integer"),
        ('[{"input": "x", "output_length": 1e300}]', "item 0: output_length: not an integer"),
        ('[{"input": "x", "output_length": 1000000000000}]', "item 0: output_length: .* range"),
        ("[" * 100_000, "not JSON"),
    ],
)
def test_a_sharegpt_run_of_another_shape_is_a_config_error(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=f"trace: run.json: {said}"):
        sharegpt_replay(Trace(text, "run.json"), ShareGptReplayConfig(), 0)


def test_a_sharegpt_run_still_reads() -> None:
    text = '[{"input": "hello there", "output_length": 0}, {"input": "hello", "output_length": 5}]'
    requests = sharegpt_replay(Trace(text, "run.json"), ShareGptReplayConfig(), 0)
    assert [r.output_tokens for r in requests] == [1, 5]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"calibrationRequests": 100_000_000}, "calibrationRequests"),
        ({"burstRateRps": 100_000}, "burstRateRps"),
        ({"burstRateRps": 1000}, "burstDurationS: .* requests"),
        ({"fleetSizes": [100_000_000]}, "fleetSizes.0"),
        ({"fleetSizes": [0]}, "fleetSizes.0"),
        ({"warmNodes": 500}, r"warmNodes: .*more than nodesTotal \(12\)"),
        ({"nodesTotal": 3}, r"warmNodes: .*6 warm nodes, more than nodesTotal \(3\)"),
        ({"nodesTotal": 20_000}, "nodesTotal"),
        ({"syncPeriodS": 0.000001}, "syncPeriodS"),
        ({"promptTokens": 10**12}, "promptTokens"),
    ],
)
def test_whatif_parameters_are_bounded(params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"p.yaml: {field}"):
        parse_document(WhatIfParams, params, "p.yaml")


def test_whatif_parameters_within_bounds_load() -> None:
    p = parse_document(WhatIfParams, {"nodesTotal": 3, "warmNodes": 3}, "p.yaml")
    assert (p.nodes_total, p.warm_nodes) == (3, 3)


def test_a_whatif_request_longer_than_the_engine_takes_is_a_config_error() -> None:
    """Not an IndexError after the calibration run: nothing would ever complete."""
    max_len = get_preset("tiny-cpu").max_model_len
    p = WhatIfParams(engine_preset="tiny-cpu", prompt_tokens=max_len, output_tokens=1)
    with pytest.raises(ConfigError, match="promptTokens \\+ outputTokens"):
        calibrate(p)
