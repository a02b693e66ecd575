"""An admin routing change is checked against the whole document (``kvEvents`` needs exactly one
``tokens``-mode variant): one that breaks a document-wide rule is a 400 naming it, and the old
routing stays. Were the document in force ever to stop validating, a change of the
InferenceEndpoints keeps the endpoints derived before rather than dropping them all."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, cast

from warmfleet.gateway.admin import AdminApi
from warmfleet.gateway.config import parse_gateway_config
from warmfleet.gateway.http.messages import ClientConnection, Request
from warmfleet.gateway.runtime import Gateway
from warmfleet.gateway.variant import RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.router import Router

TOKEN = "x" * 16
TOKENIZER: Any = object()  # a stand-in: the key builder only keeps it
TOKENS = {"key": {"mode": "tokens"}}
RELOADS = "warmfleet_gateway_config_reloads"


def _factory(routing: RoutingConfig, rng: random.Random) -> RouterLike:
    return Router(routing, rng, TOKENIZER)


def _gateway() -> Gateway:
    """Variant ``a`` in tokens mode fed by KV events, ``b`` in text mode, one InferenceEndpoint
    ``llama`` derived."""
    doc = {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "admin": {"token": TOKEN},
            "tokenizerPath": "/nonexistent/tokenizer",
            "kvEvents": {"endpoint": "tcp://127.0.0.1:5557"},
            "inferenceEndpoints": {"namespace": "ns", "apiServer": "http://127.0.0.1:1"},
            "endpoints": [
                {
                    "name": "doc",
                    "variants": [
                        {
                            "name": "a",
                            "models": ["m"],
                            "routing": TOKENS,
                            "instances": [{"id": "a1", "url": "http://10.0.0.1:8000"}],
                        },
                        {"name": "b", "instances": [{"id": "b1", "url": "http://10.0.0.2:8000"}]},
                    ],
                }
            ],
        },
    }
    gateway = Gateway(parse_gateway_config(doc), _factory)
    _publish(gateway, "llama")
    assert gateway.derived_endpoints == {"llama"}
    return gateway


def _object(name: str) -> Mapping[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "modelSource": {"uri": f"s3://m/{name}", "revision": "v1"},
            "image": "vllm/vllm-openai:v0.9",
            "variants": [{"name": "main"}],
        },
    }


def _publish(gateway: Gateway, *names: str) -> None:
    source = gateway.base_config.spec.inference_endpoints
    assert source is not None
    gateway.publish_inference_endpoints([_object(n) for n in names], source, "ns")


async def _put_routing(gateway: Gateway, variant: str, body: object) -> tuple[int, Any]:
    api = AdminApi(gateway)
    request = Request(
        cast(ClientConnection, None),
        "PUT",
        f"/admin/v1/endpoints/doc/variants/{variant}/routing",
        query="",
        headers={"authorization": f"Bearer {TOKEN}"},
        body=json.dumps(body).encode(),
        keep_alive=True,
    )
    request.match_info = {"endpoint": "doc", "variant": variant}
    response = await api.guard(api.put_routing)(request)
    return response.status, json.loads(response.body)


async def test_a_routing_change_that_breaks_kv_events_is_refused() -> None:
    gateway = _gateway()
    b = gateway.state.endpoint("doc").variant("b")
    status, answer = await _put_routing(gateway, "b", TOKENS)  # a second tokens variant
    assert status == 400, answer
    assert "kvEvents" in answer["error"]["message"]
    assert answer["error"]["param"] == "routing"
    assert b.routing_config.key.mode == "text"  # the old setting stays
    ok = {"source": "admin", "result": "ok"}
    assert not gateway.metrics.registry.get_sample_value(f"{RELOADS}_total", ok)

    _publish(gateway, "llama", "mistral")  # the next change of the objects applies
    assert gateway.derived_endpoints == {"llama", "mistral"}
    assert sorted(gateway.state.endpoints) == ["doc", "llama", "mistral"]


async def test_a_routing_change_that_keeps_the_document_valid_applies() -> None:
    gateway = _gateway()
    status, answer = await _put_routing(gateway, "b", {"strategy": {"type": "random"}})
    assert status == 200, answer
    assert gateway.state.endpoint("doc").variant("b").routing_config.strategy.type == "random"
    _publish(gateway, "llama", "mistral")
    assert gateway.derived_endpoints == {"llama", "mistral"}
    assert gateway.state.endpoint("doc").variant("b").routing_config.strategy.type == "random"


async def test_a_document_in_force_that_fails_keeps_the_derived_endpoints() -> None:
    """A live document that no longer validates (here changed behind the admin API's back):
    a change of the objects is not applied, and the derived endpoints in force stay."""
    gateway = _gateway()
    b = gateway.state.endpoint("doc").variant("b")
    b.set_routing(RoutingConfig.model_validate(TOKENS))
    syncs, errors = gateway.endpoint_syncs, gateway.endpoint_sync_errors
    _publish(gateway, "llama", "mistral")
    assert gateway.derived_endpoints == {"llama"}
    assert sorted(gateway.state.endpoints) == ["doc", "llama"]
    assert (gateway.endpoint_syncs, gateway.endpoint_sync_errors) == (syncs, errors + 1)
