"""What the tests of ``deploy/`` share: where Prometheus's promtool is."""

from __future__ import annotations

import os
import shutil

import pytest


def promtool_path() -> str:
    """``$WARMFLEET_PROMTOOL`` (``make unit`` sets it), else ``promtool`` on the PATH."""
    path = os.environ.get("WARMFLEET_PROMTOOL") or shutil.which("promtool")
    if path is None:
        pytest.skip("promtool: run `make unit` (it fetches it once per machine)")
    return path
