"""Crash-loop back-off for the embedded fleet's replicas, per Deployment.

A replica that exits on its own is replaced, as a ReplicaSet replaces a failed pod. One that
keeps exiting before it is ready (a bad model file, a port it cannot bind) would otherwise be
restarted at every reconcile pass, a process start each time. Like the kubelet's
CrashLoopBackOff, the first exit is replaced at once; every further exit with no ready replica
of the Deployment in between doubles the wait before the next start, from ``initial_s`` up to
``max_s``. A replica of the Deployment becoming ready resets it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class CrashBackoff:
    initial_s: float
    max_s: float
    _exits: dict[str, int] = field(default_factory=dict)
    _not_before_s: dict[str, float] = field(default_factory=dict)

    def exited(self, deployment: str, now_s: float) -> float:
        """A replica of ``deployment`` exited on its own at ``now_s``: the wait (s) before the
        next start."""
        exits = self._exits.get(deployment, 0) + 1
        self._exits[deployment] = exits
        wait_s = 0.0 if exits == 1 else min(self.initial_s * 2.0 ** (exits - 2), self.max_s)
        self._not_before_s[deployment] = now_s + wait_s
        return wait_s

    def ready(self, deployment: str) -> None:
        """A replica of ``deployment`` became ready: its exits are forgiven."""
        self._exits.pop(deployment, None)
        self._not_before_s.pop(deployment, None)

    def wait_s(self, deployment: str, now_s: float) -> float:
        """Seconds before a replica of ``deployment`` may start (0: now)."""
        return max(0.0, self._not_before_s.get(deployment, 0.0) - now_s)

    def exits(self, deployment: str) -> int:
        return self._exits.get(deployment, 0)

    def retain(self, deployments: Iterable[str]) -> None:
        """Forget Deployments that no longer exist."""
        keep = set(deployments)
        self._exits = {d: n for d, n in self._exits.items() if d in keep}
        self._not_before_s = {d: t for d, t in self._not_before_s.items() if d in keep}
