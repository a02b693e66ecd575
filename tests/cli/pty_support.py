"""Running ``warmfleet`` under a pseudo-terminal (as in an interactive shell) or piped, and reading
its output as it comes, each piece stamped with whether the command was still running."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from dataclasses import dataclass, field

from cli_support import WARMFLEET

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Captured:
    """What a command wrote: pieces of (text, command still running after the read)."""

    pieces: list[tuple[str, bool]] = field(default_factory=list)
    returncode: int | None = None

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)

    def text_while_running(self) -> str:
        """Everything read before the command had ended."""
        return "".join(text for text, running in self.pieces if running)


def _terminal_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CI", "TERM")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}


def run_in_pty(*args: str, deadline_s: float = 120.0) -> Captured:
    """``warmfleet ARGS`` with a 120x40 pseudo-terminal as stdin, stdout and stderr, to its end."""
    main_fd, tty_fd = pty.openpty()
    fcntl.ioctl(tty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [WARMFLEET, *args], stdin=tty_fd, stdout=tty_fd, stderr=tty_fd, env=_terminal_env(),
        close_fds=True,
    )  # fmt: skip
    os.close(tty_fd)
    out = Captured()
    end_s = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end_s:
            ready, _, _ = select.select([main_fd], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(main_fd, 65536)
            except OSError:  # EIO: the terminal's other side is closed (the command ended)
                break
            if not data:
                break
            out.pieces.append((data.decode("utf-8", "replace"), proc.poll() is None))
        else:
            raise AssertionError(f"warmfleet {' '.join(args)} still running after {deadline_s} s")
        out.returncode = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    return out


def run_piped(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``warmfleet ARGS`` with stdout and stderr piped (not terminals)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run(
        [WARMFLEET, *args], capture_output=True, text=True, timeout=timeout_s, check=False,
        stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip
