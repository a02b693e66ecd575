"""An instance URL whose host cannot be sent (an empty label, ``a..b``, or a label over 63
characters: the IDNA encoding of the Host header fails) is refused where it is validated,
naming the field: the admin API answers 400 (not 500), a reload is rejected before anything of
the file is applied, and a discovery file holding one is rejected like any invalid file (the
gateway starts; the file is read again once it changes). A file is recorded as seen only once
it has been applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from warmfleet.core.errors import ConfigError
from warmfleet.gateway.admin import AdminApi
from warmfleet.gateway.app import default_router_factory
from warmfleet.gateway.config import (
    InstanceList,
    InstanceSpec,
    load_gateway_config,
    parse_gateway_config,
    parse_instance_list,
)
from warmfleet.gateway.discovery import files
from warmfleet.gateway.http.messages import ClientConnection, Request
from warmfleet.gateway.runtime import Gateway

TOKEN = "x" * 16
BAD_URLS = ["http://a..b:8000", "http://" + "a" * 64 + ".example:8000", "http://.a:80"]


def _doc(b_url: str, weight_a: float, max_attempts: int) -> dict[str, Any]:
    return {
        "apiVersion": "warmfleet.dev/v1alpha1",
        "kind": "Gateway",
        "spec": {
            "admin": {"token": TOKEN},
            "limits": {"maxAttempts": max_attempts},
            "endpoints": [
                {
                    "name": "e",
                    "variants": [
                        {
                            "name": "a",
                            "weight": weight_a,
                            "instances": [{"id": "a1", "url": "http://10.0.0.1:8000"}],
                        },
                        {"name": "b", "instances": [{"id": "b1", "url": b_url}]},
                    ],
                }
            ],
        },
    }


async def _admin(gateway: Gateway, method: str, body: object) -> tuple[int, Any]:
    api = AdminApi(gateway)
    handler = {"POST": api.post_instance, "PUT": api.put_instances}[method]
    request = Request(
        cast(ClientConnection, None),
        method,
        "/admin/v1/endpoints/e/variants/b/instances",
        query="",
        headers={"authorization": f"Bearer {TOKEN}"},
        body=json.dumps(body).encode(),
        keep_alive=True,
    )
    request.match_info = {"endpoint": "e", "variant": "b"}
    response = await api.guard(handler)(request)
    return response.status, json.loads(response.body)


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_host_that_cannot_be_encoded_is_invalid(url: str) -> None:
    with pytest.raises(ConfigError, match=r"instances\.0\.url: .*host"):
        parse_instance_list([{"id": "x", "url": url}], "instances")
    for good in ("http://a.b:8000", "http://[::1]:8000", "http://h\u00e9.example", "https://x"):
        parse_instance_list([{"id": "x", "url": good}], "instances")


@pytest.mark.parametrize("url", BAD_URLS)
async def test_the_admin_api_answers_400_naming_the_url(url: str) -> None:
    config = parse_gateway_config(_doc("http://10.0.0.2:8000", 1.0, 2))
    gateway = Gateway(config, default_router_factory)
    status, answer = await _admin(gateway, "POST", {"id": "z", "url": url})
    assert (status, answer["error"]["param"]) == (400, "url")
    status, answer = await _admin(gateway, "PUT", {"instances": [{"id": "z", "url": url}]})
    assert (status, answer["error"]["param"]) == (400, "instances")
    assert list(gateway.state.endpoint("e").variant("b").instances) == ["b1"]


async def test_a_reload_with_such_a_url_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(_doc("http://10.0.0.2:8000", 1.0, 2)))
    gateway = Gateway(load_gateway_config(path), default_router_factory, config_path=path)
    path.write_text(json.dumps(_doc("http://a..b:8000", 7.0, 5)))
    assert gateway.reload(source="admin") is False
    state = gateway.state
    assert state.limits.max_attempts == 2
    assert state.endpoint("e").variant("a").weight == 1.0
    assert list(state.endpoint("e").variant("b").instances) == ["b1"]


def test_apply_checks_every_instance_before_changing_anything() -> None:
    """A document whose instance was never validated (built in code) is refused by
    ``GatewayState.apply`` as a whole: no setting of it is applied."""
    config = parse_gateway_config(_doc("http://10.0.0.2:8000", 1.0, 2))
    gateway = Gateway(config, default_router_factory)
    new = parse_gateway_config(_doc("http://10.0.0.3:8000", 7.0, 5))
    bad = InstanceSpec.model_construct(id="b1", url="http://a..b:8000", data_parallel_rank=None)
    variant_b = new.spec.endpoints[0].variants[1].model_copy(update={"instances": [bad]})
    endpoint = new.spec.endpoints[0].model_copy(
        update={"variants": [new.spec.endpoints[0].variants[0], variant_b]}
    )
    new = new.model_copy(update={"spec": new.spec.model_copy(update={"endpoints": [endpoint]})})
    with pytest.raises(ConfigError, match=r"spec\.endpoints\.0\.variants\.1\.instances\.0\.url"):
        gateway.state.apply(new)
    assert gateway.state.limits.max_attempts == 2
    assert gateway.state.endpoint("e").variant("a").weight == 1.0
    assert gateway.state.endpoint("e").variant("b").instances["b1"].base_url.endswith(".2:8000")


def _file_gateway(path: Path) -> Gateway:
    doc = _doc("http://10.0.0.2:8000", 1.0, 2)
    doc["spec"]["endpoints"][0]["variants"][1] = {
        "name": "b",
        "discovery": {"type": "file", "path": str(path)},
    }
    return Gateway(parse_gateway_config(doc), default_router_factory)


def test_a_discovery_file_with_such_a_url_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "instances.yaml"
    path.write_text("instances:\n- {id: ok, url: 'http://10.0.0.1:8000'}\n")
    gateway = _file_gateway(path)
    gateway.discovery.scan()  # what the start does before the first request
    variant = gateway.state.endpoint("e").variant("b")
    assert list(variant.instances) == ["ok"]
    path.write_text(
        "instances:\n- {id: ok, url: 'http://10.0.0.1:8000'}\n"
        "- {id: bad, url: 'http://a..b:8000'}\n"
    )
    gateway.discovery.scan()  # no exception: rejected, the old instances stay
    assert (gateway.discovery.errors, list(variant.instances)) == (1, ["ok"])
    gateway.discovery.scan()  # the same version: not read (nor logged) again
    assert gateway.discovery.errors == 1
    path.write_text("instances:\n- {id: ok2, url: 'http://10.0.0.3:8000'}\n")
    gateway.discovery.scan()
    assert list(variant.instances) == ["ok2"]


def test_a_file_is_seen_only_once_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose instances could not be applied (a bug past validation, here a listing
    built in code) is read again at the next scan, not taken as done."""
    path = tmp_path / "instances.yaml"
    path.write_text("instances:\n- {id: ok, url: 'http://10.0.0.1:8000'}\n")
    gateway = _file_gateway(path)
    bad = InstanceSpec.model_construct(id="bad", url="http://a..b:8000", data_parallel_rank=None)
    with monkeypatch.context() as patch:
        patch.setattr(files, "parse_instance_list", lambda *_: InstanceList(instances=[bad]))
        gateway.discovery.scan()  # logged and counted: the other files go on
    assert gateway.discovery.errors == 1
    variant = gateway.state.endpoint("e").variant("b")
    assert list(variant.instances) == []
    gateway.discovery.scan()  # the same file version, read again and applied
    assert list(variant.instances) == ["ok"]
    assert gateway.discovery.loads == 1
