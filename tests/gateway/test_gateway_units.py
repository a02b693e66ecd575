"""Unit tests of the gateway's pure pieces: config, SSE framing, variant choice, metric labels."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gateway_support import FakeRouterFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.core.errors import BadRequestError, ConfigError, NotFoundError
from warmfleet.gateway.config import InstanceSpec, parse_gateway_config, parse_instance_list
from warmfleet.gateway.kv_events.wiring import KvEventFeed
from warmfleet.gateway.metrics import GatewayMetrics
from warmfleet.gateway.openai.body import openai_fields, parse_json_object
from warmfleet.gateway.relay import SseFramer
from warmfleet.gateway.world import GatewayState

ROOT = Path(__file__).resolve().parents[2]


def doc(**spec: object) -> dict[str, object]:
    base: dict[str, object] = {
        "endpoints": [
            {
                "name": "e",
                "variants": [
                    {"name": "v", "instances": [{"id": "i0", "url": "http://127.0.0.1:1"}]}
                ],
            }
        ]
    }
    base.update(spec)
    return {"apiVersion": "warmfleet.dev/v1alpha1", "kind": "Gateway", "spec": base}


def test_defaults_and_loopback() -> None:
    config = parse_gateway_config(doc())
    assert config.spec.listen.host == "127.0.0.1"
    assert config.spec.admin.resolved_token() is None
    assert config.spec.default_endpoint_name == "e"
    assert config.spec.health.unhealthy_threshold == 2


@pytest.mark.parametrize(
    ("mutation", "field"),
    [
        ({"bogus": 1}, "spec.bogus"),
        ({"limits": {"max_body_bytes": 0}}, "spec.limits.maxBodyBytes"),
        ({"health": {"interval_s": 1, "timeout_s": 2}}, "spec.health"),
        ({"default_endpoint": "zz"}, "spec"),
        ({"admin": {"token": "short"}}, "spec.admin.token"),
        (
            {
                "endpoints": [
                    {
                        "name": "e",
                        "variants": [{"name": "v", "routing": {"strategy": {"type": "nope"}}}],
                    }
                ]
            },
            "spec.endpoints.0.variants.0.routing.strategy",
        ),
        (
            {
                "endpoints": [
                    {
                        "name": "e",
                        "variants": [{"name": "v", "instances": [{"id": "a", "url": "ftp://x"}]}],
                    }
                ]
            },
            "spec.endpoints.0.variants.0.instances.0.url",
        ),
        (
            {"endpoints": [{"name": "e", "variants": [{"name": "v"}, {"name": "v"}]}]},
            "spec.endpoints.0.variants",
        ),
    ],
)
def test_invalid_config_names_the_field(mutation: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_gateway_config(doc(**mutation))
    assert f"gateway config: {field}" in str(info.value)


def test_wrong_kind_and_version() -> None:
    bad = doc()
    bad["kind"] = "Router"
    with pytest.raises(ConfigError, match="kind"):
        parse_gateway_config(bad)


def test_instance_list_accepts_plain_list_and_rejects_duplicates() -> None:
    listing = parse_instance_list([{"id": "a", "url": "http://h:1/"}], "f")
    assert listing.instances == [InstanceSpec(id="a", url="http://h:1")]
    with pytest.raises(ConfigError, match="duplicate"):
        parse_instance_list(
            [{"id": "a", "url": "http://h:1"}, {"id": "a", "url": "http://h:2"}], "f"
        )


def test_body_parsing_rejects_bad_input() -> None:
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    for raw in (b"", b"\xff{}", b"[1]", b"{", b"[" * 100000, b'{"a": ' + b"9" * 5000 + b"}"):
        with pytest.raises(BadRequestError):
            parse_json_object(raw)
    assert openai_fields({"model": "m"}) == ("m", False)
    assert openai_fields({"model": "m", "stream": None}) == ("m", False)
    for body in ({}, {"model": ""}, {"model": 3}, {"model": "m", "stream": "yes"}):
        with pytest.raises(BadRequestError):
            openai_fields(body)


events = st.lists(
    st.binary(min_size=1, max_size=40).map(lambda b: b"data: " + b.replace(b"\n", b"") + b"\n\n"),
    min_size=1,
    max_size=12,
)


@settings(max_examples=100, deadline=None)
@given(events, st.data())
def test_sse_framer_only_releases_whole_events(
    stream_events: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(stream_events)
    cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(stream) - 1)), max_size=8)))
    pieces = [
        stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True) if stream[a:b]
    ]
    framer = SseFramer()
    out = []
    for piece in pieces:
        released = framer.feed(piece)
        assert not released or released.endswith(b"\n\n")
        out.append(released)
    out.append(framer.flush())
    assert b"".join(out) == stream


def test_sse_framer_crlf_and_giant_event() -> None:
    framer = SseFramer()
    assert framer.feed(b"data: a\r\n\r\ndata: b") == b"data: a\r\n\r\n"
    assert framer.feed(b"\r\n\r\n") == b"data: b\r\n\r\n"
    giant = b"data: " + b"x" * (2 << 20)
    assert framer.feed(giant) == giant


def test_weighted_variant_choice_and_not_found() -> None:
    spec = doc(
        endpoints=[
            {
                "name": "e",
                "variants": [
                    {"name": "a", "weight": 3, "models": ["m"]},
                    {"name": "b", "weight": 1, "models": ["m", "n"]},
                    {"name": "z", "weight": 0},
                ],
            }
        ]
    )
    state = GatewayState(parse_gateway_config(spec), FakeRouterFactory(), GatewayMetrics())
    endpoint = state.default_endpoint()
    rng = random.Random(1)
    picks = [endpoint.pick_variant("m", None, rng).name for _ in range(4000)]
    assert picks.count("z") == 0  # weight 0: only by header
    assert 2.5 < picks.count("a") / picks.count("b") < 3.5
    assert {endpoint.pick_variant("n", None, rng).name for _ in range(50)} <= {"b", "z"}
    assert endpoint.pick_variant("anything", None, rng).name == "z"  # the any-model variant
    assert endpoint.pick_variant("m", "z", rng).name == "z"
    with pytest.raises(NotFoundError):
        endpoint.pick_variant("m", "nope", rng)


def test_health_thresholds_and_router_notified() -> None:
    factory = FakeRouterFactory()
    spec = doc(
        endpoints=[
            {
                "name": "e",
                "variants": [
                    {
                        "name": "v",
                        "instances": [
                            {"id": "a", "url": "http://127.0.0.1:1"},
                            {"id": "b", "url": "http://127.0.0.1:2"},
                        ],
                    }
                ],
            }
        ]
    )
    state = GatewayState(parse_gateway_config(spec), factory, GatewayMetrics())
    variant = state.default_endpoint().variant("v")
    a = variant.instances["a"]
    assert not variant.record_failure(a, 2, "active")
    assert variant.record_failure(a, 2, "active")
    assert [i.instance_id for i in variant.healthy] == ["b"]
    assert factory.routers[-1].instance_sets[-1] == ["b"]
    assert variant.snapshot().ids() == ("b",)
    assert not variant.record_success(a, 2)
    assert variant.record_success(a, 2)
    assert factory.routers[-1].instance_sets[-1] == ["a", "b"]
    assert variant.snapshot({"a"}).ids() == ("b",)


def test_no_metric_label_collides_with_prometheus_target_labels() -> None:
    """A scraped ``instance`` or ``job`` label would be renamed ``exported_instance`` by a stock
    Prometheus (honor_labels: false), and ``by (instance)`` would group by the gateway's
    address instead of the engine instance."""
    metrics = GatewayMetrics()
    feed = KvEventFeed("m")
    feed.register_metrics(metrics.registry)
    metrics.in_flight.labels("e", "v", "i0").set(1)
    metrics.requests.labels("e", "v", "i0", "prefix_hit", "200").inc()
    labels = {
        name
        for family in metrics.registry.collect()
        for sample in family.samples
        for name in sample.labels
    }
    assert "instance_id" in labels
    assert not labels & {"instance", "job"}


def test_an_instance_keeps_its_state_unless_its_url_or_rank_changes() -> None:
    """Same id, URL and rank: the same runtime (health, load). Another rank: a new runtime
    whose requests carry the new ``X-Data-Parallel-Rank``."""
    url = "http://127.0.0.1:1"
    spec = doc(endpoints=[{"name": "e", "variants": [
        {"name": "v", "instances": [{"id": "a", "url": url, "data_parallel_rank": 0}]}
    ]}])  # fmt: skip
    state = GatewayState(parse_gateway_config(spec), FakeRouterFactory(), GatewayMetrics())
    variant = state.default_endpoint().variant("v")
    first = variant.instances["a"]
    variant.set_instances([InstanceSpec(id="a", url=url, data_parallel_rank=0)])
    assert variant.instances["a"] is first
    variant.set_instances([InstanceSpec(id="a", url=url, data_parallel_rank=1)])
    moved = variant.instances["a"]
    assert moved is not first
    assert first.removed
    assert moved.origin.extra_headers == b"X-Data-Parallel-Rank: 1\r\n"
