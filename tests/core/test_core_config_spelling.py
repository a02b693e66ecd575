"""One spelling for configuration keys (issue 21): every document kind reads camelCase keys; the
old snake_case spelling is still read, with one ``warmfleet.config`` warning per old key naming
the new one; errors name fields in the new spelling; models built in code stay silent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from warmfleet.cache.config import load_node_config
from warmfleet.core.config import (
    StrictModel,
    load_yaml_text,
    new_spellings,
    old_spellings,
    parse_document,
)
from warmfleet.core.errors import ConfigError
from warmfleet.emulator.config import EmulatorSpec, parse_emulator_document
from warmfleet.gateway.config import GatewayConfig, parse_gateway_config
from warmfleet.gateway.server_config import LimitsConfig
from warmfleet.local.config import parse_fleet
from warmfleet.sim.scenario import parse_scenario

API = "warmfleet.dev/v1alpha1"


def _gateway(limits: dict[str, Any], instances: list[dict[str, Any]]) -> dict[str, Any]:
    variant = {
        "name": "main",
        "routing": {"strategy": {"type": "prefix_hash", "prefix_length": 2048}},
        "instances": instances,
    }
    spec = {"limits": limits, "endpoints": [{"name": "chat", "variants": [variant]}]}
    return {"apiVersion": API, "kind": "Gateway", "spec": spec}


def _old_spelling_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "warmfleet.config"]


def test_snake_document_warns_once_per_old_key(caplog: pytest.LogCaptureFixture) -> None:
    instances = [
        {"id": f"i{n}", "url": f"http://127.0.0.1:{8001 + n}", "data_parallel_rank": n}
        for n in range(3)
    ]
    doc = _gateway({"max_body_bytes": 1000, "maxAttempts": 2}, instances)
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        config = parse_gateway_config(doc, "gateway.yaml")
    assert config.spec.limits.max_body_bytes == 1000
    assert config.spec.limits.max_attempts == 2
    assert sorted(_old_spelling_messages(caplog)) == [
        "gateway.yaml: spec.endpoints.0.variants.0.instances.0.data_parallel_rank (and 2 more): "
        "old spelling, use dataParallelRank (accepted until v0.3)",
        "gateway.yaml: spec.endpoints.0.variants.0.routing.strategy.prefix_length: "
        "old spelling, use prefixLength (accepted until v0.3)",
        "gateway.yaml: spec.limits.max_body_bytes: old spelling, use maxBodyBytes "
        "(accepted until v0.3)",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_camel_document_is_silent_and_equal(caplog: pytest.LogCaptureFixture) -> None:
    snake = _gateway({"max_body_bytes": 1000}, [{"id": "a", "url": "http://127.0.0.1:1"}])
    camel = yaml.safe_load(yaml.safe_dump(snake).replace("max_body_bytes", "maxBodyBytes"))
    camel["spec"]["endpoints"][0]["variants"][0]["routing"]["strategy"] = {
        "type": "prefix_hash",
        "prefixLength": 2048,
    }
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        from_camel = parse_gateway_config(camel, "gateway.yaml")
    assert _old_spelling_messages(caplog) == []
    assert from_camel == parse_gateway_config(snake, "gateway.yaml")


def test_written_documents_are_camel_and_read_back(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_gateway_config(
        _gateway({"maxBodyBytes": 1000}, [{"id": "a", "url": "http://127.0.0.1:1"}])
    )
    written = config.model_dump(mode="json", by_alias=True)
    assert "maxBodyBytes" in written["spec"]["limits"]
    assert "upstreamReadTimeoutS" in written["spec"]["limits"]
    assert "max_body_bytes" not in yaml.safe_dump(written)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        assert parse_document(GatewayConfig, written) == config
    assert _old_spelling_messages(caplog) == []


def test_errors_name_the_new_spelling() -> None:
    with pytest.raises(ConfigError) as err:
        parse_gateway_config(_gateway({"max_body_bytes": "lots"}, []), "gateway.yaml")
    assert "gateway.yaml: spec.limits.maxBodyBytes:" in str(err.value)
    assert "max_body_bytes" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_gateway_config(_gateway({"maxBodyBytes": 0}, []), "gateway.yaml")
    assert "spec.limits.maxBodyBytes:" in str(err.value)
    # an unknown key is named as the document spelt it
    with pytest.raises(ConfigError, match=r"spec\.limits\.max_bodybytes: Extra inputs"):
        parse_gateway_config(_gateway({"max_bodybytes": 1}, []), "gateway.yaml")
    # a required field is named in the new spelling
    with pytest.raises(ConfigError, match=r"spec\.modelSource: Field required"):
        parse_fleet(
            {"spec": {"nodes": [{"name": "a", "budget": 1}], "origin": {"models": []},
                      "endpoints": [{"name": "e", "spec": {"image": "x", "variants": []}}]}},
        )  # fmt: skip


def test_models_built_in_code_take_field_names_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        limits = LimitsConfig(max_body_bytes=1000, upstream_read_timeout_s=5.0)
        spec = EmulatorSpec.model_validate({"base_port": 0, "kv_capacity_tokens": 4096})
    assert limits.max_body_bytes == 1000
    assert spec.kv_capacity_tokens == 4096
    assert caplog.records == []


def test_every_config_model_reads_camel_case() -> None:
    """The shared base gives every model a camelCase key per multi-word field."""
    renames = new_spellings(GatewayConfig)
    assert renames["upstream_read_timeout_s"] == "upstreamReadTimeoutS"
    assert renames["default_chat_template_kwargs"] == "defaultChatTemplateKwargs"
    assert all("_" not in key for key in renames.values())
    assert StrictModel.model_config.get("populate_by_name") is True


def test_free_form_maps_keep_their_keys(caplog: pytest.LogCaptureFixture) -> None:
    """Map keys are values: ``maxKeyBodyBytes.text``, chat template kwargs, instance faults."""
    doc = _gateway({"maxKeyBodyBytes": {"text": 10, "tokens": 5}}, [])
    variant = doc["spec"]["endpoints"][0]["variants"][0]
    variant["routing"] = {
        "strategy": {"type": "random"},
        "key": {"mode": "text", "defaultChatTemplateKwargs": {"enable_thinking": False}},
    }
    variant["instances"] = [{"id": "a", "url": "http://127.0.0.1:1"}]
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        config = parse_gateway_config(doc)
    assert _old_spelling_messages(caplog) == []
    key = config.spec.endpoints[0].variants[0].routing.key
    assert key.default_chat_template_kwargs == {"enable_thinking": False}
    written = config.model_dump(mode="json", by_alias=True)
    assert written["spec"]["limits"]["maxKeyBodyBytes"]["text"] == 10
    key_written = written["spec"]["endpoints"][0]["variants"][0]["routing"]["key"]
    assert key_written["defaultChatTemplateKwargs"] == {"enable_thinking": False}


_EMULATOR = {"apiVersion": API, "kind": "Emulator", "spec": {"base_port": 0, "hash_seed": 3}}
_SCENARIO = (
    "kind: Scenario\nname: s\nworkload: {type: gsp, prompts_per_group: 2}\n"
    "arrival: {type: poisson, rate_rps: 2}\n"
)
_NODE = (
    "kind: NodeCacheConfig\nspec:\n  root: /tmp/x\n  capacity: {budget: 1GB}\n"
    "  reconcile_interval_s: 5\n"
)

_KINDS: dict[str, tuple[Callable[[], object], set[str]]] = {
    "Emulator": (lambda: parse_emulator_document(_EMULATOR, "emu.yaml"), {"basePort", "hashSeed"}),
    "Scenario": (lambda: parse_scenario(_SCENARIO, "s.yaml"), {"promptsPerGroup", "rateRps"}),
    "NodeCacheConfig": (lambda: load_node_config(_NODE, "node.yaml"), {"reconcileIntervalS"}),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_every_kind_warns_on_old_keys(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    load, expected = _KINDS[kind]
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        load()
    messages = _old_spelling_messages(caplog)
    assert len(messages) == len(expected), messages
    assert {m.split("use ")[1].split(" ")[0] for m in messages} == expected


def test_old_spellings_follow_lists_and_unions() -> None:
    doc = _gateway({}, [{"id": "a", "url": "http://127.0.0.1:1", "data_parallel_rank": 0}])
    config = parse_gateway_config(doc)
    found = old_spellings(config, doc)
    assert ("spec.endpoints.0.variants.0.instances.0.data_parallel_rank", "dataParallelRank") in (
        found
    )
    assert ("spec.endpoints.0.variants.0.routing.strategy.prefix_length", "prefixLength") in found


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_setting_that_is_not_a_finite_number_is_refused_naming_it(value: str) -> None:
    doc = yaml.safe_load(
        "apiVersion: warmfleet.dev/v1alpha1\nkind: Gateway\nspec:\n"
        f"  health: {{intervalS: {value}}}\n"
        "  endpoints: [{name: main, variants: [{name: v, instances: [{id: a, url: 'http://h'}]}]}]\n"
    )
    with pytest.raises(ConfigError, match=r"spec\.health\.intervalS: .*finite"):
        parse_gateway_config(doc)


def test_yaml_nested_too_deeply_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_yaml_text("a: " + "[" * 5000 + "]" * 5000, "deep.yaml")
