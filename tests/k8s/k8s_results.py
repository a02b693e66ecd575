"""TEST HARNESS: the measured fields of the k8s e2e (issue 20), in bench-results/k8s-e2e.json.

Each scenario records its fields as soon as it has measured them, and the file is rewritten at
once, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench-results" / "k8s-e2e.json"
LOG_DIR = REPO / "bench-results" / "k8s-e2e-logs"
DEPLOY = REPO / "deploy"
ENABLED = os.environ.get("WARMFLEET_E2E_K8S") == "1"
SKIP_REASON = "real-Kubernetes e2e is opt-in: `make k8s-e2e` (sets WARMFLEET_E2E_K8S=1)"


class Results:
    def __init__(self, path: Path = OUT) -> None:
        self.path = path
        self.fields: dict[str, Any] = {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self._t0 = time.monotonic()
        self.write()

    def record(self, **fields: Any) -> None:
        self.fields.update(fields)
        self.write()

    def write(self) -> None:
        self.fields["elapsed_s"] = round(time.monotonic() - self._t0, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.fields, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.path)


def documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
