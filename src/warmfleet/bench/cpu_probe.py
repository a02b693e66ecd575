"""CPU seconds of a benchmark's processes over a measured window (Linux /proc)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from warmfleet.bench.live_procs import machine_cpu_s, tree_cpu_s


@dataclass
class CpuProbe:
    """CPU seconds, between ``start`` and ``stop``, of the router trees (a router with replica
    sync: both replicas, the one routing and the peer applying its notes), the fleet tree, this
    whole process tree (client, fleet, router) and the machine (busy, and wall x CPUs)."""

    router_pids: tuple[int, ...]
    fleet_pid: int
    deltas: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0)

    def _sample(self) -> tuple[float, ...]:
        router = sum(tree_cpu_s(pid) for pid in self.router_pids)
        return (router, tree_cpu_s(self.fleet_pid), tree_cpu_s(os.getpid()), *machine_cpu_s())

    def start(self) -> None:
        self.deltas = self._sample()

    def stop(self) -> None:
        self.deltas = tuple(a - b for a, b in zip(self._sample(), self.deltas, strict=True))

    @property
    def router_s(self) -> float | None:
        return self.deltas[0] if self.router_pids else None

    @property
    def fleet_s(self) -> float:
        return self.deltas[1]

    @property
    def client_s(self) -> float:
        """This process (the load generator): the tree minus the router's and the fleet's."""
        return max(self.deltas[2] - (self.router_s or 0.0) - self.fleet_s, 0.0)

    @property
    def busy_frac(self) -> float | None:
        busy_s, total_s = self.deltas[3:]
        return busy_s / total_s if total_s > 0 else None

    @property
    def foreign_frac(self) -> float | None:
        """Share of the machine's CPU used by processes outside this benchmark."""
        own_s, busy_s, total_s = self.deltas[2:]
        return max(busy_s - own_s, 0.0) / total_s if total_s > 0 else None
