"""The one image: ``Containerfile`` builds what the install manifests name, and every container's
args are a real ``warmfleet`` command (a renamed subcommand would otherwise only fail in a
cluster)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from warmfleet.cli import app
from warmfleet.operator.manifest_parts import VERSION, Values
from warmfleet.operator.manifests import install_objects

ROOT = Path(__file__).resolve().parents[2]


def _containers() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for obj in install_objects(Values()):
        spec = obj.get("spec", {})
        pod = spec.get("template", {}).get("spec", {}) if isinstance(spec, dict) else {}
        found.extend(pod.get("containers", []))
    return found


def test_containerfile_builds_the_named_image_with_the_cli_as_entrypoint() -> None:
    text = (ROOT / "Containerfile").read_text(encoding="utf-8")
    assert re.search(r'^ENTRYPOINT \["warmfleet"\]$', text, re.MULTILINE)
    # the wheel (with its compiled modules) is built where a C compiler is, installed in slim
    assert "RUN pip wheel --no-deps --wheel-dir /wheels ." in text
    assert "COPY pyproject.toml setup.py README.md ./" in text
    assert "pip install --no-compile /wheels/*.whl" in text
    images = {str(c["image"]) for c in _containers()}
    assert images == {f"ghcr.io/warmfleet/warmfleet:{VERSION}"}
    assert f"ghcr.io/warmfleet/warmfleet:{VERSION}" in text


def test_every_container_runs_a_real_subcommand_with_known_options() -> None:
    root = typer.main.get_command(app)
    containers = _containers()
    assert len(containers) == 3  # operator, node agent, gateway
    for container in containers:
        args = [str(a) for a in container["args"]]
        command: Any = root  # typer's click (typer may vendor its own)
        words = list(args)
        while hasattr(command, "commands") and words and words[0] in command.commands:
            command = command.commands[words.pop(0)]
        assert not hasattr(command, "commands"), f"{args}: a command group, not a command"
        # Parsing the rest must succeed (options exist, values typed) without running it.
        ctx = command.make_context("warmfleet", words, resilient_parsing=False)
        assert ctx.params, args
