"""Rolling replacement of one revision's Deployments by the next (``RolloutPolicy`` Rolling).

Kubernetes' RollingUpdate arithmetic, applied across the two revisions' Deployments of one
variant instead of two ReplicaSets of one Deployment, one step per reconcile pass (pure and
level-triggered: each step is recomputed from the observed replica counts):

- the new Deployment grows while the total of declared replicas stays within
  ``replicas + maxSurge``;
- the old ones shrink while the ready replicas of both stay at ``replicas - maxUnavailable`` or
  more (a Deployment scaled down drops its replicas that are not ready first, so those never
  count against the bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from warmfleet.api.resources import IntOrPercent, RolloutPolicy
from warmfleet.control.observed import ObservedDeployment


def resolve(value: IntOrPercent, replicas: int, *, round_up: bool) -> int:
    """An integer, or a percentage of ``replicas`` (rounded up or down)."""
    if isinstance(value, int):
        return value
    share = int(value[:-1]) * replicas / 100
    return math.ceil(share) if round_up else math.floor(share)


def bounds(policy: RolloutPolicy, replicas: int) -> tuple[int, int]:
    """(surge, unavailable) for ``replicas``; both 0 becomes (0, 1), as in Kubernetes."""
    surge = resolve(policy.surge, replicas, round_up=True)
    unavailable = resolve(policy.unavailable, replicas, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


@dataclass(frozen=True, slots=True)
class RollingStep:
    new_replicas: int
    old_replicas: dict[str, int]  # old Deployment name -> its replicas after this step


def rolling_step(
    replicas: int,
    policy: RolloutPolicy,
    new: ObservedDeployment | None,
    old: Sequence[ObservedDeployment],
) -> RollingStep:
    """One step of replacing ``old`` (a variant's Deployments of earlier revisions) by ``new``
    (its Deployment of the current revision; ``None``: not created yet) at ``replicas``."""
    surge, unavailable = bounds(policy, replicas)
    new_now = new.replicas if new is not None else 0
    new_ready = new.ready_replicas if new is not None else 0
    old_now = sum(d.replicas for d in old)
    new_target = min(replicas, max(new_now, replicas + surge - old_now))
    # Old replicas that may go: everything above the availability floor, counting the new
    # revision's ready replicas only (those still starting may never become ready).
    removable = old_now + new_ready - (replicas - unavailable)
    if new is None:
        removable = 0  # nothing shrinks before the new revision exists (the weights gate)
    targets: dict[str, int] = {}
    # Shrink the Deployments with the fewest ready replicas first: their unready ones go first.
    for dep in sorted(old, key=lambda d: (d.ready_replicas, d.name)):
        cut = max(0, min(dep.replicas, removable))
        targets[dep.name] = dep.replicas - cut
        removable -= cut
    return RollingStep(new_target, targets)
