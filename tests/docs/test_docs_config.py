"""The README, docs/configuration.md and examples/ stay true to the configuration models, loaders,
CLI and Makefile.

- every YAML example loads with the loader of its ``kind``; gateway documents are also checked
  as ``warmfleet serve --check`` does (routers built);
- every YAML block of the README and of docs/configuration.md is validated by the real Gateway
  loader (fragments are put into a minimal document; each top-level line of a block is one
  alternative);
- the settings tables of docs/configuration.md (the configuration reference, moved out of the
  README) name real fields with their real defaults, and every config name in backticks in that
  reference is a field, a ``type`` or a key mode;
- examples/gateway.yaml shows every gateway setting and marks each non-default value;
- every ``warmfleet`` command and flag, and every ``make`` target, the README and
  docs/configuration.md name exists.
"""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import typer
import yaml
from docs_support import (
    CONFIGURATION,
    EXAMPLES,
    README,
    ROOT,
    code_blocks,
    code_spans,
    default_of,
    document_key,
    field_at,
    field_name,
    model_tree,
    section,
    tables_after,
    top_level_chunks,
)
from pydantic import BaseModel

from warmfleet.cache.config import load_node_config
from warmfleet.cli import app
from warmfleet.emulator.config import load_emulator_config
from warmfleet.gateway.cli import check_config
from warmfleet.gateway.config import (
    GatewayConfig,
    GatewaySpec,
    VariantConfig,
    load_gateway_config,
    parse_gateway_config,
)
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.local.config import load_fleet
from warmfleet.routing.config import STRATEGY_NAMES, PrefixHashConfig, StrategyConfig
from warmfleet.routing.key_spec import KeyMode
from warmfleet.sim.scenario import parse_scenario

README_TEXT = README.read_text(encoding="utf-8")
CONFIGURATION_TEXT = CONFIGURATION.read_text(encoding="utf-8")
CONFIG_REFERENCE = section(CONFIGURATION_TEXT, "# Configuration reference")
_CHECKED_DOCS = (("README.md", README_TEXT), ("docs/configuration.md", CONFIGURATION_TEXT))
GATEWAY_EXAMPLE = EXAMPLES / "gateway.yaml"
GATEWAY_EXAMPLES = (GATEWAY_EXAMPLE, EXAMPLES / "gateway-vllm.yaml")
_BASE_INSTANCES = [{"id": "docs-0", "url": "http://127.0.0.1:9"}]


def _base_gateway() -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {"endpoints": [{"name": "e", "variants": [{"name": "v", "instances": []}]}]},
    }


# ---- examples/ --------------------------------------------------------------------------------


def _load_example(path: Path) -> None:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "Gateway":
        config = load_gateway_config(path)
        tokenizer = config.spec.tokenizer_path
        if tokenizer is None or Path(tokenizer).exists():
            check_config(path)  # what `warmfleet serve --check` runs: every router built
    elif kind == "Scenario":
        parse_scenario(path.read_text(encoding="utf-8"), str(path))
    elif kind == "LocalFleet":
        load_fleet(path)
    elif kind == "Emulator":
        load_emulator_config(path)
    elif kind == "NodeCacheConfig":
        load_node_config(path.read_text(encoding="utf-8"), str(path))
    else:
        pytest.fail(f"{path}: no loader for kind {kind!r}")


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_example_loads(path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="warmfleet.config"):
        _load_example(path)
    old = [r.getMessage() for r in caplog.records if r.name == "warmfleet.config"]
    assert not old, f"{path} uses old (snake_case) spellings: {old}"


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


def _default_at(root: type[BaseModel], path: str) -> Any:
    """The default of ``path`` below ``root``: read from the parent's default object where there
    is one (``routing.strategy.type`` is the default strategy's), else the field's own."""
    parts = path.split(".")
    value: Any = None
    model: type[BaseModel] = root
    for i, part in enumerate(parts):
        if i == 0:
            value = default_of(model, part)
        elif isinstance(value, BaseModel):
            value = getattr(value, field_name(type(value), part))
        else:
            owner, name = field_at(root, path)
            return default_of(owner, name)
    return value


_TABLES = (
    ("A `Gateway` document's settings", GatewaySpec),
    ("A variant's settings", VariantConfig),
)


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
    bad = [n for n in names if not set(n.split(".")) <= vocabulary]
    assert not bad, f"docs/configuration.md names unknown settings: {bad}"
    for name in names:
        if name.startswith("spec."):
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


# ---- examples/gateway.yaml: every setting, non-defaults marked ---------------------------------

_STRATEGY_KNOBS_ELSEWHERE = {  # their knobs are documented in docs/routing.md
    m for m in get_args(get_args(StrategyConfig)[0]) if m is not PrefixHashConfig
}


def test_gateway_examples_show_every_setting() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in GATEWAY_EXAMPLES)
    missing = []
    for model in model_tree(GatewayConfig):
        for name in model.model_fields:
            if model in _STRATEGY_KNOBS_ELSEWHERE and name != "type":
                continue
            key = document_key(model, name)
            if not re.search(rf"\b{re.escape(key)}\b", text):
                missing.append(f"{model.__name__}.{key}")
    assert not missing, f"settings missing from {[p.name for p in GATEWAY_EXAMPLES]}: {missing}"


_LINE = re.compile(
    r"^(?P<indent>\s*)(?P<dash>- )?(?P<key>[A-Za-z_]+):(?P<value>[^#]*)(?P<comment>#.*)?$"
)


def _example_settings(path: Path) -> list[tuple[int, str, str, str]]:
    """(line, dotted path below spec, raw value, comment) of every uncommented scalar or flow
    setting of a block-style YAML file; list items add ``[]`` to the path."""
    out = []
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = _LINE.match(line)
        if match is None or line.lstrip().startswith("#"):
            continue
        indent = len(match["indent"]) + (2 if match["dash"] else 0)
        while stack and stack[-1][0] >= (indent - 1 if match["dash"] else indent):
            stack.pop()  # a new list item also closes the previous one
        if match["dash"]:
            stack.append((indent - 1, "[]"))
        keys = [k for _, k in stack] + [match["key"]]
        value = match["value"].strip()
        if value:
            out.append((number, ".".join(keys), value, match["comment"] or ""))
        else:
            stack.append((indent, match["key"]))
    return out


def _model_path(dotted: str) -> tuple[type[BaseModel], str] | None:
    """``spec.endpoints.[].variants.[].routing.key.mode`` -> (root model, path below it)."""
    if not dotted.startswith("spec."):
        return None
    path = dotted[len("spec.") :]
    if ".[]." in path and not path.startswith("endpoints.[].variants.[]."):
        return None
    if path.startswith("endpoints.[].variants.[]."):
        root: type[BaseModel] = VariantConfig
        path = path[len("endpoints.[].variants.[].") :]
    else:
        root = GatewaySpec
    if "[]" in path:
        return None
    if path.startswith("routing.strategy.") and path != "routing.strategy.type":
        return PrefixHashConfig, path.rsplit(".", 1)[1]  # the one strategy with knobs set here
    try:
        field_at(root, path)
    except KeyError:
        pytest.fail(f"examples/gateway.yaml: {dotted} is not a setting")
    return root, path


def test_gateway_example_marks_non_defaults() -> None:
    seen: set[str] = set()
    unmarked = []
    for number, dotted, raw, comment in _example_settings(GATEWAY_EXAMPLE):
        if dotted in {"apiVersion", "kind"}:
            continue
        target = _model_path(dotted)
        if target is None or dotted in seen:
            continue
        seen.add(dotted)
        root, path = target
        default = _default_at(root, path)
        if default == "<required>":
            continue
        value = yaml.safe_load(raw)
        if value != default and "default" not in comment:
            unmarked.append(f"line {number}: {dotted}: {value!r} (default {default!r})")
    assert len(seen) >= 25
    assert not unmarked, f"non-default values without a `default:` comment: {unmarked}"


# ---- commands, flags, make targets ------------------------------------------------------------


def _commands_in_readme() -> list[str]:
    """Every ``warmfleet ...`` invocation in backticks (a following span like `` `ls` `` in the
    same table cell is a sibling subcommand) or in an untagged code block."""
    found = []
    all_text = "\n".join(text for _, text in _CHECKED_DOCS)
    for line in all_text.splitlines():
        if not line.startswith("|"):
            found += [s for s in code_spans(line) if s.startswith("warmfleet ")]
            continue
        for cell in line.strip("|").split("|"):
            parent: list[str] = []
            for span in code_spans(cell):
                if span.startswith("warmfleet "):
                    found.append(span)
                    words = [w for w in span.split()[1:] if re.match(r"^[a-z][a-z-]*$", w)]
                    parent = words[:1]
                elif parent and re.match(r"^[a-z][a-z-]*( |$)", span):
                    found.append(" ".join(["warmfleet", *parent, span]))
    for _, block in code_blocks(README_TEXT, "") + code_blocks(CONFIGURATION_TEXT, ""):
        joined = block.replace("\\\n", " ")
        found += [ln.strip() for ln in joined.splitlines() if ln.strip().startswith("warmfleet ")]
    return found


def test_readme_commands_exist() -> None:
    root: Any = typer.main.get_command(app)
    commands = _commands_in_readme()
    assert len(commands) >= 15
    problems = []
    for invocation in commands:
        command = root
        for word in invocation.split()[1:]:
            word = word.strip("[]")
            if word.startswith("--"):
                flag = word.split("=")[0]
                opts = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
                if flag not in opts:
                    problems.append(f"{invocation}: no option {flag}")
            elif hasattr(command, "commands") and re.match(r"^[a-z][a-z-]*$", word):
                if word not in command.commands:
                    problems.append(f"{invocation}: no command {word}")
                    break
                command = command.commands[word]
    assert not problems, problems


def test_readme_make_targets_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, re.M))
    named = set(re.findall(r"`make ([a-z0-9-]+)", README_TEXT))
    named_in_docs = named | set(re.findall(r"`make ([a-z0-9-]+)", CONFIGURATION_TEXT))
    assert {"demo", "test"} <= named
    assert named_in_docs <= targets, f"docs name missing make targets: {named_in_docs - targets}"


def test_readme_quick_start_is_two_commands() -> None:
    quick = section(README_TEXT, "## Quick start")
    assert code_blocks(quick + "\n", "")[0][1] == "make demo\nmake test\n"


# ---- metrics ---------------------------------------------------------------------------------

_README_METRICS = {  # README phrase (Operations) -> gateway metric family
    "requests by variant, instance, reason and status": "warmfleet_gateway_requests",
    "in-flight requests": "warmfleet_gateway_in_flight_requests",
    "decision time": "warmfleet_gateway_decision_seconds",
    "gateway overhead": "warmfleet_gateway_overhead_seconds",
    "TTFT": "warmfleet_gateway_ttft_seconds",
    "spills": "warmfleet_gateway_spills",
    "predicted prefix hits": "warmfleet_gateway_predicted_prefix_hits",
}


def test_readme_metrics_exist() -> None:
    operations = section(README_TEXT, "### Operations")
    families = {m.name: m for m in GatewayMetrics().registry.collect()}
    for phrase, name in _README_METRICS.items():
        assert phrase in operations, phrase
        assert name in families, name
    requests = GatewayMetrics().requests.labelnames
    assert {"variant", "reason", "status", "instance_id"} <= set(requests)
    assert "`instance_id`" in operations
    for family in (GatewayMetrics().requests, GatewayMetrics().in_flight):
        assert "instance" not in family.labelnames


def test_installed_gateway_configmap_follows_inference_endpoints() -> None:
    """README, Kubernetes: the gateway ConfigMap the install creates follows the
    InferenceEndpoints, `model` picks the endpoint."""
    path = ROOT / "deploy/manifests/warmfleet.yaml"
    assert "`warmfleet-gateway`" in README_TEXT
    maps = [
        d
        for d in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if d and d["metadata"]["name"] == "warmfleet-gateway"
    ]
    documents = [v for d in maps if d.get("kind") == "ConfigMap" for v in d["data"].values()]
    assert len(documents) == 1
    config = parse_gateway_config(yaml.safe_load(documents[0]), str(path))
    assert config.spec.inference_endpoints is not None
    assert config.spec.model_selects_endpoint


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
