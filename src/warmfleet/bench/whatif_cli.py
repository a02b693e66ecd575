"""`warmfleet fleet whatif`: the scale-out what-if (``sim.whatif``), its report merged into
``--out``; registered under ``warmfleet fleet`` by the root command (``warmfleet.cli``).

Everything that can be wrong is checked before the seconds of work: the parameters (a YAML
mapping of ``WhatIfParams``), and ``--out`` (writable, and when it exists a JSON object the report
is added to). The run shows its progress: the calibration, then each scenario.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from warmfleet.bench.progress import Activity, PhasedProgress
from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.core.failures import one_line
from warmfleet.edge import check_output_file, load_yaml_file
from warmfleet.sim.whatif import WhatIfParams, run_whatif

_KINDS = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list"}


def load_params(path: Path | None) -> WhatIfParams:
    """``--params``: a YAML mapping of what-if parameters (camelCase), each one not given keeping
    its default; no file: every default. Anything else is a ConfigError naming the file."""
    if path is None:
        return WhatIfParams()
    data = load_yaml_file(path)
    if not isinstance(data, dict):
        got = "an empty document" if data is None else _KINDS.get(type(data), "another value")
        raise ConfigError(f"{path}: a mapping of what-if parameters (e.g. warmNodes: 4), got {got}")
    return parse_document(WhatIfParams, data, str(path))


def existing_report(out: Path) -> dict[str, Any]:
    """What ``out`` holds already (the what-if is added to it): {} when it does not exist."""
    check_output_file(out, "--out")
    if not out.exists():
        return {}
    try:
        existing = json.loads(out.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{out}: not JSON: {err}") from err
    if not isinstance(existing, dict):
        raise ConfigError(f"{out}: not a JSON object (whatif adds its report to it)")
    return existing


def whatif(
    out: Annotated[Path, typer.Option(help="JSON report path", readable=False)] = Path(
        "bench-results/fleet.json"
    ),
    params: Annotated[
        Path | None, typer.Option(help="YAML overriding WhatIfParams", readable=False)
    ] = None,
) -> None:
    """Traffic burst with autoscaling: cold vs weights cached vs weights+image cached; peer
    distribution: origin egress and time to capacity with and without peers."""
    try:
        p = load_params(params)
    except ConfigError as err:
        typer.echo(
            f"warmfleet fleet whatif: invalid what-if parameters: {one_line(str(err))}", err=True
        )
        raise typer.Exit(2) from err
    existing = existing_report(out)  # checked before the run (seconds of work)
    with Activity() as activity:
        progress = PhasedProgress(activity)
        report = run_whatif(p, progress=progress)
        progress.close()
    existing["whatif"] = report
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
    for name, result in report["scenarios"].items():  # type: ignore[attr-defined]
        typer.echo(
            f"{name:14s} capacity in {result['time_to_capacity_s']} s, "
            f"TTFT p95 {result['ttft_p95_ms'] / 1000:.1f} s "
            f"p99 {result['ttft_p99_ms'] / 1000:.1f} s, "
            f"unprepared requests {result['unprepared_request_share']:.1%}"
        )
    _echo_peers(report["peer_distribution"])  # type: ignore[arg-type]
    typer.echo(f"wrote {out}")


def _echo_peers(peers: dict[str, dict[str, dict[str, float]]]) -> None:
    for origin in ("shared_link", "per_node_origin"):
        for nodes, c in peers[origin].items():
            typer.echo(
                f"peers {origin:15s} {nodes:>3s} nodes: origin egress "
                f"{c['origin_egress_bytes_without_peers'] / 1e9:,.0f} -> "
                f"{c['origin_egress_bytes_with_peers'] / 1e9:,.0f} GB, capacity in "
                f"{c['time_to_capacity_s_without_peers']:,.0f} -> "
                f"{c['time_to_capacity_s_with_peers']:,.0f} s"
            )


def register(fleet_app: typer.Typer) -> None:
    """``warmfleet fleet whatif`` (``fleet_app``: the operator's ``warmfleet fleet`` group)."""
    fleet_app.command("whatif")(whatif)
