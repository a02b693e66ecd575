"""The Prometheus alert rules of ``deploy/prometheus``: Prometheus's own checker accepts them,
its rule unit tests (``warmfleet-alerts.test.yaml``) make every alert fire where something is
wrong and stay silent where nothing is, and every series and label an alert reads is one the
gateway or the node agent exports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from deploy_support import promtool_path

from support.exported_series import gateway_registry, node_agent_registry, series_labels

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "warmfleet-alerts.yaml"
UNIT_TESTS = Path(__file__).with_name("warmfleet-alerts.test.yaml")
SERIES = re.compile(r"\bwarmfleet_[a-z_]+")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules_and_runs_their_unit_tests() -> None:
    promtool = promtool_path()
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(UNIT_TESTS)]):
        done = subprocess.run(
            [promtool, *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_fires_in_a_unit_test() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert {rule["alert"] for rule in _alerts()} == fired
    assert all(rule["labels"]["severity"] in {"critical", "warning", "info"} for rule in _alerts())


def test_alerts_read_only_exported_series_and_their_labels() -> None:
    exported = series_labels(gateway_registry()) | series_labels(node_agent_registry())
    for rule in _alerts():
        expr = rule["expr"]
        used = set(SERIES.findall(expr))
        assert used, rule["alert"]
        assert used <= exported.keys(), (rule["alert"], used - exported.keys())
        labels = frozenset().union(*(exported[name] for name in used))
        named = {m for group in GROUPING.findall(expr) for m in re.findall(r"\w+", group)}
        named |= {m for group in MATCHERS.findall(expr) for m in MATCHER_LABEL.findall(group)}
        assert named <= labels, (rule["alert"], named - labels)
        for text in rule["annotations"].values():
            templated = set(re.findall(r"\$labels\.(\w+)", text))
            assert templated <= labels, (rule["alert"], templated - labels)


def test_docs_describe_every_alert() -> None:
    docs = (ROOT / "docs" / "alerts.md").read_text()
    listed = set(re.findall(r"^\| `(Warmfleet\w+)` \|", docs, re.M))
    assert listed == {rule["alert"] for rule in _alerts()}
