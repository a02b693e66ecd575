"""Status updates for ModelCache and ImageCache objects (only when they changed)."""

from __future__ import annotations

from warmfleet.api.resources import ImageCacheStatus
from warmfleet.control.actions import Action, UpdateImageCacheStatus, UpdateModelCacheStatus
from warmfleet.control.observed import NodeCacheReport, ObservedState
from warmfleet.control.status import cache_status, target_nodes


def cache_status_actions(
    wanted_models: set[str], wanted_images: set[str], observed: ObservedState
) -> list[Action]:
    actions: list[Action] = []
    for cache in sorted(observed.model_caches, key=lambda c: c.name):
        nodes = target_nodes(observed.nodes, cache.spec.node_selector)
        reports: dict[str, NodeCacheReport | None] = {
            n.name: n.weights.get(cache.name) for n in nodes
        }
        status = cache_status(reports, deleting=cache.name not in wanted_models)
        if status != cache.status:
            actions.append(UpdateModelCacheStatus(cache.name, status))
    for image in sorted(observed.image_caches, key=lambda c: c.name):
        nodes = target_nodes(observed.nodes, image.spec.node_selector)
        image_reports: dict[str, NodeCacheReport | None] = {
            n.name: n.images.get(image.name) for n in nodes
        }
        base = cache_status(image_reports, deleting=image.name not in wanted_images)
        digest = image.status.resolved_digest if image.status is not None else ""
        status = ImageCacheStatus(
            **base.model_dump(),
            resolved_digest=digest,
            references=len(image.spec.parent_references),
        )
        if status != image.status:
            actions.append(UpdateImageCacheStatus(image.name, status))
    return actions
