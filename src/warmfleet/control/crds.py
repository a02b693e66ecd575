"""Render the resource model as Kubernetes CRDs (apiextensions.k8s.io/v1, structural schemas).

The OpenAPI v3 schemas are generated from the pydantic models, then made *structural*:
references inlined, ``anyOf [X, null]`` turned into ``X`` + ``nullable``, ``const`` into a
one-value ``enum``, JSON-Schema-2020 ``exclusiveMinimum: x`` into OpenAPI 3.0's
``minimum: x, exclusiveMinimum: true``, ``additionalProperties: false`` dropped (unknown fields are
pruned by the API server and rejected by the operator's pydantic parse). The only subtree kept
open with ``x-kubernetes-preserve-unknown-fields`` is a variant's routing ``strategy`` (a
discriminated union on ``type``, which structural schemas cannot express); the operator validates
it with ``warmfleet.routing.config.RoutingConfig``.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from warmfleet.control.resources import (
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


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    if _is_union(node):
        desc = node.get("description", "a discriminated union on `type`")
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": desc}
    out: dict[str, Any] = {}
    if "anyOf" in node:  # Optional[X]
        (inner,) = _non_null(node["anyOf"])
        merged = {**inner, **{k: v for k, v in node.items() if k != "anyOf"}}
        out = _structural(merged)
        out["nullable"] = True
        out.pop("default", None)
        return out
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "default" and isinstance(value, dict | list):
            continue  # nested defaults are applied by pydantic, not the API server
        elif key == "prefixItems":
            continue
        elif key in ("properties",):
            out[key] = {k: _structural(v) for k, v in value.items()}
        else:
            out[key] = _structural(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


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
    return [
        _crd(
            "InferenceEndpoint",
            plural="inferenceendpoints",
            short=["wie"],
            spec=InferenceEndpointSpec,
            status=EndpointStatus,
            columns=endpoint_columns,
        ),
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
