"""What the edges read from disk for the pure core: the edge reads, the core validates.

The pure packages (core, api, routing, engine, sim, cache, control) parse text and validate
documents; they never open a file nor guess where one lives. The CLI commands and the shells
read configuration documents with ``read_text_file``/``load_yaml_file`` and hand the text or the
parsed YAML in, and find the traces of trace-driven scenarios with ``resolve_traces_dir``.
The shells that start servers on loopback pick their port with ``free_port``.
Below every shell and CLI (import-linter layers); imports only ``warmfleet.core``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from warmfleet.core.config import load_yaml_text
from warmfleet.core.errors import ConfigError

TRACES_DIR_ENV = "WARMFLEET_TRACES_DIR"
DEFAULT_TRACES_DIR = Path("../shared/traces")  # relative to the current directory


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def read_text_file(path: Path) -> str:
    """The UTF-8 text of ``path``; an unreadable file is a ConfigError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from err


def load_yaml_file(path: Path) -> Any:
    """Read and parse a YAML (or JSON) document file; an unreadable file is a ConfigError."""
    return load_yaml_text(read_text_file(path), str(path))


def resolve_traces_dir(explicit: Path | None = None) -> Path:
    """Where trace files are: ``explicit`` (``--traces-dir``), else ``$WARMFLEET_TRACES_DIR``,
    else ``../shared/traces`` relative to the current directory (the repository's root)."""
    if explicit is not None:
        return explicit
    configured = os.environ.get(TRACES_DIR_ENV)
    return Path(configured) if configured else DEFAULT_TRACES_DIR
