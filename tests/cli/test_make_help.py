"""``make help`` lists every target of the Makefile, one line each."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"


def phony_targets_with_a_rule(text: str) -> set[str]:
    """Targets declared ``.PHONY`` that have a rule of their own (``name:`` at a line start)."""
    phony = {t for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for t in line.split()}
    ruled = set(re.findall(r"^([A-Za-z0-9_-]+):(?!=)", text, re.M))
    return phony & ruled


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target_on_one_line() -> None:
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", str(MAKEFILE), "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    listed = [line.split()[1] for line in lines if line.startswith("make ")]
    assert len(listed) == len(lines)  # nothing but "make TARGET  what it does" lines
    assert all(len(line.split()) > 2 for line in lines)  # each says what it does
    targets = phony_targets_with_a_rule(MAKEFILE.read_text(encoding="utf-8"))
    assert {"demo", "test", "help"} <= targets
    assert sorted(targets - set(listed)) == []
    assert sorted(t for t in set(listed) if listed.count(t) > 1) == []
    assert not set(listed) - targets  # no target that does not exist
