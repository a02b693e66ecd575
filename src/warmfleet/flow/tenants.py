"""Per-tenant limits of flow control (pure): requests running and a token bucket for each
tenant with limits (``TenantLimits``). A tenant with nothing running and a full bucket again is
as good as new, so it is forgotten once there are many: a tenant header or ``prompt_cache_key``
per conversation must not grow the state without bound."""

from __future__ import annotations

from dataclasses import dataclass

from warmfleet.routing.flow_config import TenantLimits

MAX_TENANTS = 4096  # tenants' states kept before the idle ones are forgotten


def limited(limits: TenantLimits) -> bool:
    return limits.max_concurrent_requests is not None or limits.tokens_per_minute is not None


@dataclass(slots=True)
class TenantState:
    limits: TenantLimits
    running: int = 0
    bucket_tokens: float = 0.0
    refilled_s: float = 0.0

    def refill(self, now_s: float) -> None:
        tpm = self.limits.tokens_per_minute
        if tpm is not None:
            elapsed_s = max(0.0, now_s - self.refilled_s)
            self.bucket_tokens = min(float(tpm), self.bucket_tokens + elapsed_s * tpm / 60.0)
        self.refilled_s = now_s

    def allows(self, now_s: float) -> bool:
        """A request may start: under the concurrency limit, and tokens left in the bucket."""
        cap = self.limits.max_concurrent_requests
        if cap is not None and self.running >= cap:
            return False
        if self.limits.tokens_per_minute is None:
            return True
        self.refill(now_s)
        return self.bucket_tokens > 0

    def start(self, tokens: int) -> None:
        """A request of ``tokens`` (prompt and expected output) starts: the bucket may go into
        debt by a minute's worth at most (a ``max_tokens`` of billions must not lock the tenant
        out for days)."""
        self.running += 1
        tpm = float(self.limits.tokens_per_minute or 0)
        self.bucket_tokens = max(-tpm, self.bucket_tokens - tokens)


class TenantStates:
    """The states of the tenants with limits, by name."""

    def __init__(self) -> None:
        self._states: dict[str, TenantState] = {}
        self._bound = MAX_TENANTS  # idle ones are forgotten past this many (amortised O(1))

    def __len__(self) -> int:
        return len(self._states)

    def get(self, tenant: str) -> TenantState | None:
        return self._states.get(tenant)

    def state(self, tenant: str, limits: TenantLimits, now_s: float) -> TenantState:
        found = self._states.get(tenant)
        if found is not None:
            return found
        if len(self._states) >= self._bound:
            self._forget_idle(now_s)
        tpm = float(limits.tokens_per_minute or 0)
        state = self._states[tenant] = TenantState(limits, bucket_tokens=tpm, refilled_s=now_s)
        return state

    def _forget_idle(self, now_s: float) -> None:
        for name, state in list(self._states.items()):
            state.refill(now_s)
            tpm = state.limits.tokens_per_minute
            if state.running == 0 and (tpm is None or state.bucket_tokens >= tpm):
                del self._states[name]
        self._bound = max(MAX_TENANTS, 2 * len(self._states))
