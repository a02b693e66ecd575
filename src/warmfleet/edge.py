"""What the edges read from disk for the pure core: the edge reads, the core validates.

The pure packages (core, api, routing, engine, sim, cache, control) parse text and validate
documents; they never open a file nor guess where one lives. The CLI commands and the shells
read configuration documents with ``read_text_file``/``load_yaml_file`` and hand the text or the
parsed YAML in, and find the traces of trace-driven scenarios with ``resolve_traces_dir``.
The shells that start servers on loopback pick their port with ``free_port``. Commands that
write a file or a directory at the end of a long run check it first (``check_output_file``,
``check_output_dir``).
Below every shell and CLI (import-linter layers); imports only ``warmfleet.core``.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Any

from warmfleet.core.config import load_yaml_text
from warmfleet.core.errors import ConfigError

TRACES_DIR_ENV = "WARMFLEET_TRACES_DIR"
DEFAULT_TRACES_DIR = Path("../shared/traces")  # relative to the current directory
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# free_port's picks: above the ports system services take, below Kubernetes' NodePort range
_PICK_FIRST, _PICK_END, _PICK_MIN_SPAN, _PICK_ATTEMPTS = 20_000, 30_000, 1_000, 100


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, picked below the kernel's ephemeral range.

    A port from that range (what binding port 0 gives) can become the source port of a
    loopback connection (a health probe, a client) between being picked and being bound by
    the server it was picked for: "address already in use" (seen in CI on a gateway's listen
    port). Below the range the kernel never hands it out by itself. Where the range leaves
    too little room below it, the port-0 pick it is."""
    first, end = _PICK_FIRST, min(_PICK_END, ephemeral_port_range()[0])
    if end - first >= _PICK_MIN_SPAN:
        pick = random.Random()
        for _ in range(_PICK_ATTEMPTS):
            port = pick.randrange(first, end)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for ports it picks by itself (Linux's default when unreadable)."""
    try:
        low, high = _EPHEMERAL_RANGE.read_text(encoding="ascii").split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32_768, 60_999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def read_text_file(path: Path) -> str:
    """The UTF-8 text of ``path``; an unreadable file is a ConfigError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from err


def load_yaml_file(path: Path) -> Any:
    """Read and parse a YAML (or JSON) document file; an unreadable file is a ConfigError."""
    return load_yaml_text(read_text_file(path), str(path))


def check_output_file(path: Path, flag: str) -> None:
    """Before any work: a file can be written at ``path`` (a missing parent directory is made
    then). A directory there, or a parent that is a file or cannot be written in, is a
    ConfigError naming ``flag``, so a long run does not fail at its end."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory, not a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {path}: cannot write it (permission denied)")
        return
    _check_creatable(path, flag)


def check_output_dir(path: Path, flag: str) -> None:
    """Before any work: ``path`` is a directory files can be written in, or can be made one."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is a file, not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: cannot write in it (permission denied)")
        return
    _check_creatable(path, flag)


def _check_creatable(path: Path, flag: str) -> None:
    """``path`` does not exist: its nearest existing ancestor is a directory one can write in."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{flag} {path}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot write in {ancestor} (permission denied)")


def resolve_traces_dir(explicit: Path | None = None) -> Path:
    """Where trace files are: ``explicit`` (``--traces-dir``), else ``$WARMFLEET_TRACES_DIR``,
    else ``../shared/traces`` relative to the current directory (the repository's root)."""
    if explicit is not None:
        return explicit
    configured = os.environ.get(TRACES_DIR_ENV)
    return Path(configured) if configured else DEFAULT_TRACES_DIR
