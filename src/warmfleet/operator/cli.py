"""`warmfleet fleet ...`: manifest rendering and the Kubernetes operator (the scale-out what-if,
`warmfleet fleet whatif`, is ``bench.whatif_cli``: the root command adds it to this group).

kopf is imported only by `warmfleet fleet operator`, so the other commands start fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.display import CommandGroup

fleet_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="Fleet controller: what-if, manifests, operator.",
)


@fleet_app.command("render")
def render(
    out: Annotated[Path, typer.Option(help="deploy directory", readable=False)] = Path("deploy"),
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
            readable=False,  # read by the kube client: a refused read is its one-line error
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
