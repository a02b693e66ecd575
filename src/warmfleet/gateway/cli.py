"""`warmfleet serve --config gateway.yaml [--check]` and `warmfleet sync-key`.

The command also runs alone (``python -m warmfleet.gateway``, child processes of the live bench
and of ``warmfleet up``), so it turns its own expected failures (a bad config, a port in use)
into one line on stderr and exit 2, as the root command does for every other command.
"""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from warmfleet.core.errors import ConfigError
from warmfleet.core.failures import DEBUG_META_KEY, EXPECTED_EXIT, expected_failure
from warmfleet.display import LogLevel
from warmfleet.edge import load_yaml_file


def serve_command(
    ctx: typer.Context,
    config: Path = typer.Option(  # noqa: B008  (not readable=True: one line from edge, not a box)
        ..., "--config", "-c", readable=False, help="Gateway document (kind: Gateway)."
    ),
    log_level: LogLevel = typer.Option(LogLevel.info, case_sensitive=False),  # noqa: B008
    check: bool = typer.Option(
        False, "--check", help="Validate the document and build every router, then exit."
    ),
) -> None:
    """Run the OpenAI-compatible gateway. SIGHUP reloads the config file."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if check:
            print(check_config(config))
            return
        _serve(config)
    except Exception as err:
        line = expected_failure(err)
        if line is None or ctx.meta.get(DEBUG_META_KEY):  # `warmfleet --debug serve`
            raise
        what = "invalid config: " if isinstance(err, ConfigError) else ""
        typer.echo(f"warmfleet serve: {what}{line}", err=True)
        raise typer.Exit(EXPECTED_EXIT) from err


def _serve(config: Path) -> None:
    from warmfleet.gateway.server import StartedApp, run  # noqa: PLC0415

    def ready(started: StartedApp) -> None:
        print(f"warmfleet gateway listening on {started.url}", flush=True)

    run(config, ready)


def check_config(path: Path) -> str:
    """What ``serve`` would do at start, short of opening sockets: load and validate the
    document, load the tokenizer, build every variant's router and read the admin token.
    Returns a summary; raises ``ConfigError`` naming the field."""
    from warmfleet.gateway.app import create_app  # noqa: PLC0415
    from warmfleet.gateway.config import (  # noqa: PLC0415
        FileDiscovery,
        KubernetesDiscovery,
        load_gateway_config,
    )

    config = load_gateway_config(path)
    state = create_app(config, config_path=path).gateway.state
    spec = config.spec
    lines = [f"{path}: valid; would listen on {spec.listen.host}:{spec.listen.port}"]
    for endpoint in state.endpoints.values():
        for variant in endpoint.variants.values():
            disc = variant.config.discovery
            if isinstance(disc, FileDiscovery):
                where = _discovery_file(Path(disc.path))
            elif isinstance(disc, KubernetesDiscovery):
                where = f"instances from {disc.source}"
            else:
                where = f"{len(variant.instances)} static instance(s)"
            lines.append(
                f"  {endpoint.name}/{variant.name}: {variant.routing_config.strategy.type}, "
                f"weight {variant.weight:g}, {where}"
            )
    if spec.inference_endpoints is not None:
        namespace = spec.inference_endpoints.namespace or "the pod's namespace"
        lines.append(f"  + one endpoint per InferenceEndpoint in {namespace}")
    return "\n".join(lines)


def _discovery_file(path: Path) -> str:
    """What the variant would start with from its discovery file: its instances, or none yet
    when it is not there (the gateway waits for it); a file there that ``serve`` would reject is
    a ``ConfigError`` naming it."""
    from warmfleet.gateway.config import parse_instance_list  # noqa: PLC0415

    if not path.exists() and not path.is_symlink():
        return f"instances from {path} (not there yet: none until it is)"
    listing = parse_instance_list(load_yaml_file(path), str(path))
    return f"{len(listing.instances)} instance(s) from {path}"


def sync_key_command() -> None:
    """Print a new CURVE secret key for the gateway replicas' sync: give every replica of one
    gateway the same, in the variable that spec.replicaSync.curveSecretEnv names."""
    from warmfleet.gateway.replica_sync.curve import new_secret  # noqa: PLC0415

    typer.echo(new_secret())


def register(app: typer.Typer) -> None:
    """``serve`` alone (a one-command app runs it without the subcommand's name)."""
    app.command("serve")(serve_command)
