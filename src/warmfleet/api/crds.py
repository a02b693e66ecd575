"""Render the resource model as Kubernetes CRDs (apiextensions.k8s.io/v1, structural schemas).

The OpenAPI v3 schemas are generated from the pydantic models, then made *structural*:
references inlined, ``anyOf [X, null]`` turned into ``X`` + ``nullable``, ``const`` into a
one-value ``enum``, JSON-Schema-2020 ``exclusiveMinimum: x`` into OpenAPI 3.0's
``minimum: x, exclusiveMinimum: true``, ``additionalProperties: false`` dropped (unknown fields are
pruned by the API server and rejected by the operator's pydantic parse). The subtrees kept
open with ``x-kubernetes-preserve-unknown-fields`` are a variant's routing ``strategy`` (a
discriminated union on ``type``, which structural schemas cannot express) and the free-form JSON
map ``routing.key.defaultChatTemplateKwargs``; the operator validates both with
``warmfleet.routing.config.RoutingConfig``. ``routing.key`` keeps its typed properties and also
preserves unknown fields: its keys were spelt snake_case before v0.2 (``block_size``), and an
object stored with that spelling must reach the operator (which still accepts it) instead of
being pruned by the API server; until the old spelling is dropped (v0.3).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from warmfleet.api.resources import (
    API_GROUP,
    API_VERSION_NAME,
    CacheStatus,
    EndpointStatus,
    ImageCacheSpec,
    ImageCacheStatus,
    InferenceEndpointSpec,
    ModelCacheSpec,
)

_DROP = frozenset({"title", "discriminator", "additionalProperties_false"})


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **extra}, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k != "$defs"}


def _is_union(node: dict[str, Any]) -> bool:
    return "oneOf" in node or ("anyOf" in node and len(_non_null(node["anyOf"])) > 1)


def _non_null(options: list[Any]) -> list[Any]:
    return [o for o in options if o != {"type": "null"}]


def _int_or_string(node: dict[str, Any]) -> dict[str, Any] | None:
    """Kubernetes' IntOrString (``int | str``, optionally nullable), else None."""
    options = _non_null(node.get("anyOf", []))
    if sorted(o.get("type", "") for o in options) != ["integer", "string"]:
        return None
    out: dict[str, Any] = {"x-kubernetes-int-or-string": True}  # no type: allowed for it
    if len(options) < len(node["anyOf"]):
        out["nullable"] = True
    if "description" in node:
        out["description"] = node["description"]
    return out


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    if (int_or_string := _int_or_string(node)) is not None:
        return int_or_string
    if node.get("type") == "object" and node.get("additionalProperties") == {}:
        # a map of arbitrary JSON values (``dict[str, JsonValue]``): kept whole, checked by
        # the operator's pydantic parse
        free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        return {**free, **({"description": node["description"]} if "description" in node else {})}
    if _is_union(node):
        desc = node.get("description", "a discriminated union on `type`")
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": desc}
    if "anyOf" in node:  # Optional[X]
        (inner,) = _non_null(node["anyOf"])
        merged = {**inner, **{k: v for k, v in node.items() if k != "anyOf"}}
        out = _structural(merged)
        out["nullable"] = True
        out.pop("default", None)
        return out
    out = {}
    for key, value in node.items():
        out.update(_structural_item(key, value))
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _structural_item(key: str, value: Any) -> dict[str, Any]:
    """One keyword of a schema node, in OpenAPI 3.0 structural form (nothing: dropped)."""
    if key in _DROP or (key == "additionalProperties" and value is False):
        return {}
    if key == "const":
        return {"enum": [value]}
    if key == "exclusiveMinimum":
        return {"minimum": value, "exclusiveMinimum": True}
    if key == "exclusiveMaximum":
        return {"maximum": value, "exclusiveMaximum": True}
    if (key == "default" and isinstance(value, dict | list)) or key == "prefixItems":
        return {}  # nested defaults are applied by pydantic, not the API server
    if key == "properties":
        return {key: {k: _structural(v) for k, v in value.items()}}
    return {key: _structural(value)}


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema for ``model`` (camelCase field names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    resolved = _resolve(raw, raw.get("$defs", {}))
    result: dict[str, Any] = _structural(resolved)
    return result


def _crd(
    kind: str,
    *,
    plural: str,
    short: list[str],
    spec: type[BaseModel],
    status: type[BaseModel],
    columns: list[dict[str, str]],
) -> dict[str, Any]:
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(spec),
            "status": openapi_schema(status),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["warmfleet"],
            },
            "versions": [
                {
                    "name": API_VERSION_NAME,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        *columns,
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def _cache_columns() -> list[dict[str, str]]:
    return [
        {"name": "State", "type": "string", "jsonPath": ".status.state"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyNodes"},
        {"name": "Target", "type": "integer", "jsonPath": ".status.targetNodes"},
    ]


def all_crds() -> list[dict[str, Any]]:
    endpoint_columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
        {"name": "Revision", "type": "string", "jsonPath": ".status.revision"},
    ]
    endpoint = _crd(
        "InferenceEndpoint",
        plural="inferenceendpoints",
        short=["wie"],
        spec=InferenceEndpointSpec,
        status=EndpointStatus,
        columns=endpoint_columns,
    )
    _keep_old_key_spelling(endpoint)
    return [
        endpoint,
        _crd(
            "ModelCache",
            plural="modelcaches",
            short=["wmc"],
            spec=ModelCacheSpec,
            status=CacheStatus,
            columns=_cache_columns(),
        ),
        _crd(
            "ImageCache",
            plural="imagecaches",
            short=["wic"],
            spec=ImageCacheSpec,
            status=ImageCacheStatus,
            columns=[
                *_cache_columns(),
                {"name": "Refs", "type": "integer", "jsonPath": ".status.references"},
            ],
        ),
    ]


def _keep_old_key_spelling(crd: dict[str, Any]) -> None:
    """``spec.variants[].routing.key`` also keeps unknown (old snake_case) fields (module doc)."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    variant = schema["properties"]["spec"]["properties"]["variants"]["items"]
    variant["properties"]["routing"]["properties"]["key"][
        "x-kubernetes-preserve-unknown-fields"
    ] = True
