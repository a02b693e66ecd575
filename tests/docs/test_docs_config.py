"""The configuration reference (docs/configuration.md) and the README's YAML stay true to the
configuration models: every YAML block is validated by the real Gateway loader (fragments are
put into a minimal document; each top-level line of a block is one alternative), the settings
tables name real fields with their real defaults, every config name in backticks is a field, a
``type`` or a key mode, the strategy list and its bounds are the models', and which documents
may omit apiVersion and kind is as stated."""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from docs_support import (
    _CHECKED_DOCS,
    CONFIGURATION_TEXT,
    README_TEXT,
    _default_at,
    code_blocks,
    code_spans,
    document_key,
    field_at,
    model_tree,
    section,
    tables_after,
    top_level_chunks,
)
from pydantic import BaseModel

from warmfleet.gateway.cli import check_config
from warmfleet.gateway.config import GatewayConfig, GatewaySpec, VariantConfig
from warmfleet.local.config import LocalFleet, LocalFleetSpec
from warmfleet.routing.config import STRATEGY_NAMES, PrefixHashConfig, StrategyConfig
from warmfleet.routing.key_spec import KeyMode

CONFIG_REFERENCE = section(CONFIGURATION_TEXT, "# Configuration reference")


_BASE_INSTANCES = [{"id": "docs-0", "url": "http://127.0.0.1:9"}]


def _base_gateway() -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"endpoints": [{"name": "e", "variants": [{"name": "v", "instances": []}]}]},
    }


# ---- README YAML blocks -----------------------------------------------------------------------


def _document_for(fragment: dict[str, Any]) -> dict[str, Any]:
    """A whole Gateway document around one README fragment."""
    if "apiVersion" in fragment:
        return fragment
    doc = _base_gateway()
    if set(fragment) == {"spec"}:
        doc["spec"].update(fragment["spec"])
        return doc
    variant_keys = {document_key(VariantConfig, n) for n in VariantConfig.model_fields}
    unknown = set(fragment) - variant_keys
    if unknown:
        pytest.fail(f"README fragment with top-level {sorted(unknown)}: no gateway place for it")
    variant = doc["spec"]["endpoints"][0]["variants"][0]
    variant.update(fragment)
    if "discovery" in fragment:
        del variant["instances"]
    elif "instances" not in fragment:
        variant["instances"] = copy.deepcopy(_BASE_INSTANCES)
    return doc


def _chunks(block: str) -> list[str]:
    """A block that starts with ``apiVersion:`` is one whole document; any other block is split
    into its alternatives."""
    return [block] if block.startswith("apiVersion:") else top_level_chunks(block)


def _readme_fragments() -> list[tuple[str, str]]:
    return [
        (f"{name}:{line}#{i}", chunk)
        for name, text in _CHECKED_DOCS
        for line, block in code_blocks(text, "yaml")
        for i, chunk in enumerate(_chunks(block))
    ]


def test_readme_has_yaml_blocks() -> None:
    assert len(_readme_fragments()) >= 5
    assert code_blocks(README_TEXT, "yaml"), "the README shows no YAML at all"
    assert len(code_blocks(CONFIGURATION_TEXT, "yaml")) >= 3


@pytest.mark.parametrize(("where", "chunk"), _readme_fragments(), ids=lambda v: str(v)[:40])
def test_readme_yaml_validates(
    where: str, chunk: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fragment = yaml.safe_load(chunk)
    assert isinstance(fragment, dict), where
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(_document_for(fragment)), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        check_config(path)
    old = [r.getMessage() for r in caplog.records if r.name == "warmfleet.config"]
    assert not old, f"{where} uses old (snake_case) spellings: {old}"


# ---- README settings tables -------------------------------------------------------------------


_TABLES = (
    ("A `Gateway` document's settings", GatewaySpec),
    ("A variant's settings", VariantConfig),
    ("A `LocalFleet` document's peer settings", LocalFleetSpec),
)
# Names below these are a LocalFleet's (its spec's peers table), checked against that model.
_FLEET_NAMES = ("peers.", "spec.peers.")


def _table_rows() -> list[tuple[str, type[BaseModel], list[str]]]:
    rows: list[tuple[str, type[BaseModel], list[str]]] = []
    for marker, root in _TABLES:
        for row in tables_after(CONFIG_REFERENCE, marker):
            rows.append((f"{root.__name__}:{row[0]}", root, row))
    return rows


def test_readme_settings_tables_present() -> None:
    assert len(_table_rows()) >= 25
    assert "`docs/configuration.md`" in section(README_TEXT, "### Configuration"), (
        "the README's configuration section must point to the reference"
    )


@pytest.mark.parametrize(("where", "root", "row"), _table_rows(), ids=lambda v: str(v)[:50])
def test_readme_setting_default(where: str, root: type[BaseModel], row: list[str]) -> None:
    settings = code_spans(row[0])
    assert settings, f"{where}: no setting named"
    for setting in settings:
        field_at(root, setting)  # KeyError: the README names a field the model lacks
    defaults_cell = row[1]
    if defaults_cell == "required":
        assert all(_default_at(root, s) == "<required>" for s in settings), where
        return
    spans = code_spans(defaults_cell)
    if spans:
        assert len(spans) == len(settings), f"{where}: one default per setting"
        for setting, text in zip(settings, spans, strict=True):
            assert yaml.safe_load(text) == _default_at(root, setting), f"{where}: {setting}"
    elif "unset" in defaults_cell:
        assert defaults_cell.count("unset") == len(settings), where
        for setting in settings:
            assert _default_at(root, setting) is None, f"{where}: {setting} has a default"


# ---- config names in the configuration reference ----------------------------------------------

_NAME = re.compile(r"^[a-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def _vocabulary() -> set[str]:
    """Every key a gateway document may spell (camelCase: an old snake_case spelling in the
    docs is not in it), the strategy and discovery types and the key modes."""
    names = {"spec", "prompt_cache_key"}  # a body field, named as the tenant key's source
    for model in model_tree(GatewayConfig):
        names.update(document_key(model, n) for n in model.model_fields)
    names.update(STRATEGY_NAMES)
    names.update(get_args(KeyMode))
    names.update(("static", "file", "kubernetes"))
    return names


def _reference_names() -> list[str]:
    """Backticked names of the configuration reference, tables' default columns left out (they
    hold values such as the salt ``warmfleet``)."""
    text_lines = []
    prose = re.sub(r"^```.*?^```", "", CONFIG_REFERENCE, flags=re.S | re.M)
    for line in prose.splitlines():
        if line.startswith("|"):
            cells = line.strip().strip("|").split("|")
            line = " ".join(cells[:1] + cells[2:])
        text_lines.append(line)
    spans = code_spans("\n".join(text_lines))
    return sorted({s for s in spans if _NAME.match(s)})


def _yaml_comment_names() -> list[str]:
    """Setting-like words (snake_case or camelCase) in the comments of the reference's YAML
    blocks."""
    words = []
    for _, block in code_blocks(CONFIG_REFERENCE, "yaml"):
        for line in block.splitlines():
            if "#" in line:
                words += re.findall(
                    r"\b[a-z]+(?:_[a-z0-9_]+|[A-Z][A-Za-z0-9]*)\b", line.split("#", 1)[1]
                )
    return words


def test_reference_names_are_config_names() -> None:
    vocabulary = _vocabulary()
    names = _reference_names() + _yaml_comment_names()
    assert len(names) >= 20
    fleet = [n for n in names if n.startswith(_FLEET_NAMES)]
    for name in fleet:  # KeyError: not a LocalFleet setting
        field_at(LocalFleet, name if name.startswith("spec.") else f"spec.{name}")
    bad = [n for n in names if n not in fleet and not set(n.split(".")) <= vocabulary]
    assert not bad, f"docs/configuration.md names unknown settings: {bad}"
    for name in names:
        if name.startswith("spec.") and name not in fleet:
            field_at(GatewayConfig, name)


def test_strategy_list_matches_models() -> None:
    """The routing snippet's comment lists exactly the strategy ``type`` names."""
    listed = set(
        re.findall(
            r"\b[a-z_]+\b", CONFIG_REFERENCE.split("type: prefix_affinity")[1].split("epsilon")[0]
        )
    )
    members = {m.model_fields["type"].default for m in get_args(get_args(StrategyConfig)[0])}
    assert members == set(STRATEGY_NAMES)
    assert members <= listed, f"missing from docs/configuration.md: {members - listed}"
    pa = PrefixHashConfig.model_fields
    assert "(1,024\N{EN DASH}65,536)" in CONFIG_REFERENCE
    assert [m.ge for m in pa["prefix_length"].metadata if hasattr(m, "ge")] == [1024]
    assert [m.le for m in pa["prefix_length"].metadata if hasattr(m, "le")] == [65536]
    assert "(1\N{EN DASH}1,024)" in CONFIG_REFERENCE
    assert [m.ge for m in pa["concurrency_threshold"].metadata if hasattr(m, "ge")] == [1]
    assert [m.le for m in pa["concurrency_threshold"].metadata if hasattr(m, "le")] == [1024]


def test_which_documents_may_omit_apiversion_and_kind() -> None:
    """README: `Gateway` and `Emulator` must state apiVersion and kind; the others may not."""
    from warmfleet.cache.config import NodeCacheConfig  # noqa: PLC0415
    from warmfleet.emulator.config import EmulatorDocument  # noqa: PLC0415
    from warmfleet.local.config import LocalFleet  # noqa: PLC0415
    from warmfleet.sim.scenario import ScenarioSpec  # noqa: PLC0415

    stated = "`Gateway` and `Emulator` documents must state both; `Scenario`, `NodeCacheConfig` and"
    assert stated in CONFIG_REFERENCE.replace("\n", " ")
    for model, required in (
        (GatewayConfig, True),
        (EmulatorDocument, True),
        (ScenarioSpec, False),
        (NodeCacheConfig, False),
        (LocalFleet, False),
    ):
        fields = [f for n, f in model.model_fields.items() if n in {"apiVersion", "api_version"}]
        fields.append(model.model_fields["kind"])
        assert len(fields) == 2, model
        assert all(f.is_required() == required for f in fields), model
