"""Expected failures of a command, and their one-line message.

A command's expected failures are the ones a user causes or meets (a port in use, a missing or
unreadable file, a bad configuration, an unreachable URL, a refused permission): each ends the
command with one line on stderr and exit status ``EXPECTED_EXIT``. Anything else is a bug and keeps
its traceback. The CLI edges (``warmfleet.cli`` for every command, and the commands that also run
alone as child processes) ask ``expected_failure`` which case an exception is; nothing here prints.
"""

from __future__ import annotations

import errno
import re

from warmfleet.core.errors import WarmfleetError

EXPECTED_EXIT = 2
# Key of the click context's ``meta`` set by ``warmfleet --debug``: expected failures keep their
# traceback too.
DEBUG_META_KEY = "warmfleet.debug"
# OSErrors that say the program itself is wrong (a closed descriptor, a bad address), not the
# machine or the user's input: they keep their traceback.
_BUG_ERRNOS = frozenset({errno.EBADF, errno.EFAULT, errno.ENOTSOCK})
_ERRNO_PREFIX = re.compile(r"^\[Errno -?\d+\]\s*")
MAX_LINE_CHARS = 600


def one_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` on one line: its non-blank lines joined by ``; ``, runs of spaces collapsed, cut
    to ``limit`` characters (an ellipsis says so)."""
    parts = [" ".join(line.split()) for line in text.splitlines()]
    joined = "; ".join(part for part in parts if part)
    return joined if len(joined) <= limit else joined[: limit - 3].rstrip() + "..."


def _os_error_line(err: OSError) -> str | None:
    if err.errno is None and not isinstance(err, ConnectionError | TimeoutError):
        return None  # an OSError raised by code without an errno: not an environment failure
    if err.errno in _BUG_ERRNOS:
        return None
    text = _ERRNO_PREFIX.sub("", str(err)) or type(err).__name__
    if isinstance(err, TimeoutError) and text == type(err).__name__:
        return "timed out"
    return one_line(text)


def expected_failure(err: BaseException) -> str | None:
    """The one-line message of an expected failure, or None when ``err`` is a bug (or not an
    error at all: ``SystemExit``, ``KeyboardInterrupt``).

    Expected: every ``WarmfleetError`` (``ConfigError`` names the field; raised on purpose with a
    message for the user) and the ``OSError``s of the environment (address in use, no such file,
    permission denied, connection refused, host unreachable, disk full, timeouts)."""
    if isinstance(err, BaseExceptionGroup):  # from a task group: expected if every part is
        lines = [expected_failure(inner) for inner in err.exceptions]
        if all(line is not None for line in lines):
            return one_line("\n".join(dict.fromkeys(line for line in lines if line)))
        return None
    if isinstance(err, WarmfleetError):
        return one_line(str(err)) or type(err).__name__
    if isinstance(err, OSError):
        return _os_error_line(err)
    return None
