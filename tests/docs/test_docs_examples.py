"""examples/ stays true to the loaders: every YAML example loads with the loader of its
``kind``, in the new spelling (gateway documents also as ``warmfleet serve --check`` does, routers
built), and examples/gateway.yaml with examples/gateway-vllm.yaml shows every gateway setting,
each non-default value marked as such."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import get_args

import pytest
import yaml
from docs_support import EXAMPLES, _default_at, document_key, field_at, model_tree
from pydantic import BaseModel

from warmfleet.cache.config import load_node_config
from warmfleet.emulator.config import load_emulator_config
from warmfleet.gateway.cli import check_config
from warmfleet.gateway.config import GatewayConfig, GatewaySpec, VariantConfig, load_gateway_config
from warmfleet.local.config import VllmEngine, load_fleet
from warmfleet.routing.config import PrefixHashConfig, StrategyConfig
from warmfleet.sim.scenario import parse_scenario

GATEWAY_EXAMPLE = EXAMPLES / "gateway.yaml"
GATEWAY_EXAMPLES = (GATEWAY_EXAMPLE, EXAMPLES / "gateway-vllm.yaml")


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
        engine = doc.get("spec", {}).get("engine", {})
        python = Path(engine.get("python", VllmEngine.model_fields["python"].default))
        if engine.get("type") == "vllm" and not python.is_file():  # checked at load time
            pytest.skip(f"{python} does not exist: `make vllm-venv` builds it (`make test` does)")
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
