"""Per-tenant figures of a simulated run (``tenants`` in ``warmfleet sim``'s JSON).

A request's tenant comes from its trace record (``WorkloadRequest.tenant``); requests without one
are counted under ``NO_TENANT`` when some others have one. A run with no tenant at all has no
per-tenant figures (an empty mapping).
"""

from __future__ import annotations

from collections.abc import Sequence

from warmfleet.sim.metrics import percentile
from warmfleet.sim.records import RequestRecord
from warmfleet.sim.workloads.base import WorkloadRequest

NO_TENANT = "(none)"
TENANT_PERCENTILES = (50, 95, 99)


def tenant_figures(
    requests: Sequence[WorkloadRequest], records: Sequence[RequestRecord]
) -> dict[str, dict[str, object]]:
    """Tenant -> ``requests`` (sent), ``completed``, ``hit_rate`` (cached / prompt tokens of its
    completed requests) and ``ttft_ms`` P50/P95/P99; ``records[i]`` is ``requests[i]``'s."""
    if all(req.tenant is None for req in requests):
        return {}
    groups: dict[str, list[RequestRecord]] = {}
    for req, record in zip(requests, records, strict=True):
        groups.setdefault(req.tenant or NO_TENANT, []).append(record)
    out: dict[str, dict[str, object]] = {}
    for tenant in sorted(groups):
        sent = groups[tenant]
        done = [r for r in sent if r.done and not r.rejected]
        ttft_s = [r.first_token_s - r.arrival_s for r in done]
        prompt_tokens = sum(r.prompt_tokens for r in done)
        out[tenant] = {
            "requests": len(sent),
            "completed": len(done),
            "hit_rate": sum(r.cached_tokens for r in done) / prompt_tokens
            if prompt_tokens
            else 0.0,
            "ttft_ms": {f"p{p}": percentile(ttft_s, p) * 1000.0 for p in TENANT_PERCENTILES},
        }
    return out
