"""The Grafana dashboards of ``deploy/grafana``: each reads only series its process exports,
every series has a panel (a histogram's ``_count`` and ``_sum`` go with its ``_bucket``), and
every query is PromQL that Prometheus's own parser accepts once Grafana's variables are set."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import promtool_path
from prometheus_client import CollectorRegistry

from support.exported_series import gateway_registry, node_agent_registry, series_labels

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = {
    "warmfleet-gateway.json": ("warmfleet_gateway_", gateway_registry),
    "warmfleet-node-agent.json": ("warmfleet_cache_", node_agent_registry),
}
# What Grafana puts in place of its variables before a query reaches Prometheus.
VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s"}


def _exprs(name: str) -> list[str]:
    dashboard: dict[str, Any] = json.loads((GRAFANA / name).read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


@pytest.mark.parametrize(("name", "family"), DASHBOARDS.items(), ids=list(DASHBOARDS))
def test_every_exported_series_and_only_those_on_a_panel(
    name: str, family: tuple[str, Any]
) -> None:
    prefix, registry = family
    exported = set(series_labels(registry()))
    used = {m for e in _exprs(name) for m in re.findall(rf"\b{prefix}[a-z_]+", e)}
    assert used <= exported, used - exported
    assert {m for m in exported - used if not m.endswith(("_count", "_sum"))} == set()


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    promtool = promtool_path()
    rules = []
    for name in DASHBOARDS:
        for i, expr in enumerate(_exprs(name)):
            query = expr
            for variable, value in VARIABLES.items():
                query = query.replace(variable, value)
            query = re.sub(r"\$\w+", ".*", query)  # $endpoint, $variant, $node: "All"
            record = f"dashboard:{name.removesuffix('.json').replace('-', '_')}:{i}"
            rules.append({"record": record, "expr": query})
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_registries_are_not_empty() -> None:
    """A registry that lost its families would make the checks above vacuous."""
    for _prefix, registry in DASHBOARDS.values():
        made: CollectorRegistry = registry()
        assert len(series_labels(made)) > 10
