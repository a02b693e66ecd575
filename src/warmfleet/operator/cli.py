"""`warmfleet fleet ...`: the scale-out what-if, manifest rendering and the Kubernetes operator.

kopf is imported only by `warmfleet fleet operator`, so the other commands start fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from warmfleet.core.config import parse_document
from warmfleet.core.errors import ConfigError
from warmfleet.core.failures import one_line
from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.display import CommandGroup
from warmfleet.edge import load_yaml_file

fleet_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="Fleet controller: what-if, manifests, operator.",
)


@fleet_app.command("whatif")
def whatif(
    out: Annotated[Path, typer.Option(help="JSON report path")] = Path("bench-results/fleet.json"),
    params: Annotated[Path | None, typer.Option(help="YAML overriding WhatIfParams")] = None,
) -> None:
    """Traffic burst with autoscaling: cold vs weights cached vs weights+image cached; peer
    distribution: origin egress and time to capacity with and without peers."""
    from warmfleet.sim.whatif import WhatIfParams, run_whatif  # noqa: PLC0415

    try:
        data = load_yaml_file(params) if params else {}
        p = parse_document(WhatIfParams, data or {}, str(params or "defaults"))
    except ConfigError as err:
        typer.echo(
            f"warmfleet fleet whatif: invalid what-if parameters: {one_line(str(err))}", err=True
        )
        raise typer.Exit(2) from err
    existing: dict[str, object] = {}
    if out.exists():  # checked before the run (seconds of work)
        try:
            existing = json.loads(out.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigError(f"{out}: not JSON: {err}") from err
        if not isinstance(existing, dict):
            raise ConfigError(f"{out}: not a JSON object (whatif adds its report to it)")
    report = run_whatif(p)
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


@fleet_app.command("render")
def render(
    out: Annotated[Path, typer.Option(help="deploy directory")] = Path("deploy"),
    force: Annotated[bool, typer.Option("--force", help="overwrite files that differ")] = False,
) -> None:
    """Write the CRDs, the plain manifests and the Helm chart generated from the resource model.

    Existing files that differ are left alone (exit 2) unless --force is given."""
    from warmfleet.operator.manifests import rendered_files, write_all  # noqa: PLC0415

    differ = [
        out / rel
        for rel, content in rendered_files().items()
        if (out / rel).exists() and (out / rel).read_bytes() != content.encode()
    ]
    if differ and not force:
        typer.echo(
            f"warmfleet fleet render: {len(differ)} existing file(s) would change, e.g. "
            f"{differ[0]}: pass --force to overwrite them, or --out another directory",
            err=True,
        )
        raise typer.Exit(2)
    for path in write_all(out):
        typer.echo(f"wrote {path}")


@fleet_app.command("operator")
def operator(
    namespace: Annotated[str, typer.Option(help="namespace to manage")] = "default",
    gateway_metrics: Annotated[
        list[str] | None, typer.Option(help="gateway /metrics URL (repeat); enables autoscaling")
    ] = None,
    gateway_service: Annotated[
        list[str] | None,
        typer.Option(
            help="gateway Service as namespace/name[:port] (repeat): scrape /metrics of each of "
            "its ready pods; enables autoscaling"
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBECONFIG",
            help="kubeconfig file (out of cluster): its current context's server, bearer token "
            "and CA. Default: in a pod its service account, else ~/.kube/config if present",
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option(help="kubeconfig context (default: its current context)")
    ] = None,
) -> None:
    """Run the kopf operator against the cluster of its service account, or of a kubeconfig."""
    from warmfleet.kube.access import KubeAccessError  # noqa: PLC0415
    from warmfleet.operator.gateway_metrics import GatewayService  # noqa: PLC0415
    from warmfleet.operator.handlers import run_operator  # noqa: PLC0415

    try:
        services = [GatewayService.parse(text) for text in gateway_service or ()]
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--gateway-service") from err
    try:
        api = KubeApiSpec(kubeconfig=_kubeconfig(kubeconfig), context=context)
        if api.kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise KubeAccessError(
                "not in a cluster ($KUBERNETES_SERVICE_HOST is unset) and no kubeconfig: "
                "pass --kubeconfig or set $KUBECONFIG"
            )
        run_operator(namespace, gateway_metrics or (), services, api)
    except (KubeAccessError, ValidationError) as err:
        line = " ".join(str(err).split())
        typer.echo(f"warmfleet fleet operator: {line}", err=True)
        raise typer.Exit(2) from err


def _kubeconfig(given: Path | None) -> str | None:
    """The kubeconfig to use: the one given (or $KUBECONFIG's first file), else none in a pod,
    else ~/.kube/config when it exists."""
    if given is not None:
        first = str(given).split(os.pathsep)[0]
        return first or None
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def register(app: typer.Typer) -> None:
    app.add_typer(fleet_app, name="fleet")
