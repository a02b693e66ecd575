"""The gateway's documents as they are live, and their validation as a whole.

The admin API changes a variant's routing and instances in place; the document the runtime
re-applies when the InferenceEndpoints change is the one given (file, reload) with each variant
as it is live (``live_document``), so a change of the objects leaves admin changes alone. A
document built in code (``model_copy``) is not validated: ``revalidated`` checks it against
every rule, the document-wide ones (``kvEvents`` needs exactly one ``tokens``-mode variant)
included, before it is applied, and before an admin change is accepted.
"""

from __future__ import annotations

from warmfleet.core.config import validate_fields
from warmfleet.gateway.config import GatewayConfig, VariantConfig
from warmfleet.gateway.world import GatewayState


def live_document(
    config: GatewayConfig,
    state: GatewayState,
    endpoint: str | None = None,
    changed: VariantConfig | None = None,
) -> GatewayConfig:
    """``config`` with each of its variants as ``state`` has it live (after admin changes);
    ``changed`` replaces the variant of that name in ``endpoint`` (an admin change to check)."""
    endpoints = []
    for ep in config.spec.endpoints:
        live = state.endpoints.get(ep.name)
        live_variants = live.variants if live is not None else {}
        variants = []
        for variant in ep.variants:
            if changed is not None and (ep.name, variant.name) == (endpoint, changed.name):
                variants.append(changed)
            elif variant.name in live_variants:
                variants.append(live_variants[variant.name].config)
            else:
                variants.append(variant)
        endpoints.append(ep.model_copy(update={"variants": variants}))
    spec = config.spec.model_copy(update={"endpoints": endpoints})
    return config.model_copy(update={"spec": spec})


def revalidated(config: GatewayConfig, source: str) -> GatewayConfig:
    """``config`` validated again as a whole: ``ConfigError`` naming each field or rule it
    breaks (``source``: what the message says it is)."""
    return validate_fields(GatewayConfig, config.model_dump(mode="json", by_alias=True), source)
