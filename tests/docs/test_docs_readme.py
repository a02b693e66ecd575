"""What the README and docs/configuration.md name exists: every ``warmfleet`` command and
flag, every ``make`` target, the two-command quick start, the gateway metrics of Operations, and
the gateway ConfigMap the install creates (it follows the InferenceEndpoints)."""

from __future__ import annotations

import re
from typing import Any

import typer
import yaml
from docs_support import (
    _CHECKED_DOCS,
    CONFIGURATION_TEXT,
    README_TEXT,
    ROOT,
    code_blocks,
    code_spans,
    section,
)

from warmfleet.cli import app
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.metrics import GatewayMetrics

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
