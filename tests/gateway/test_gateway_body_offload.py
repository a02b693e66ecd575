"""Where a body's work runs: big bodies are parsed and keyed on the worker thread, small ones
on the event loop (and the thread and the switch interval are gone after ``stop``); the yielding
parser the worker uses gives ``loads_body``'s values and refuses what it refuses with a 400."""

from __future__ import annotations

import json
import random
import sys
import threading
import weakref
from collections.abc import Sequence

import pytest
from gateway_support import CHAT, backends_running, chat, gateway_config, gateway_running, post

from warmfleet.core.errors import BadRequestError
from warmfleet.core.jsonio import (
    COUNT_STEP_BYTES,
    FAST_PARSE_MAX_VALUES,
    loads_body,
    loads_body_yielding,
    value_bound,
)
from warmfleet.core.types import Decision, FleetSnapshot, RoutingKey
from warmfleet.gateway.openai.body import SWITCH_INTERVAL_S, free_in_steps
from warmfleet.gateway.variant import RouterLike
from warmfleet.routing.config import RoutingConfig
from warmfleet.routing.request import KeyRequest
from warmfleet.routing.router import Router

# --------------------------------------------------------------------------------------------
# Where the work runs


class ThreadRecorder:
    """Real routers; records the thread each key was built on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, config: RoutingConfig, rng: random.Random) -> RouterLike:
        return _Recording(Router(config, rng), self.threads)


class _Recording:
    """A ``Router`` that records the thread each key is built on (a wrapper, not a subclass: the
    router may be compiled, docs/compiled.md)."""

    def __init__(self, router: Router, threads: list[str]) -> None:
        self.router = router
        self.threads = threads

    def key(self, request: KeyRequest) -> RoutingKey:
        self.threads.append(threading.current_thread().name)
        return self.router.key(request)

    def choose(self, key: RoutingKey, fleet: FleetSnapshot) -> Decision:
        return self.router.choose(key, fleet)

    def on_routed(self, key: RoutingKey, decision: Decision) -> None:
        self.router.on_routed(key, decision)

    def on_instances_changed(self, instance_ids: Sequence[str]) -> None:
        self.router.on_instances_changed(instance_ids)

    def adopt(self, previous: object) -> None:
        self.router.adopt(previous.router if isinstance(previous, _Recording) else previous)

    @property
    def engine_stats_interval_s(self) -> float | None:
        return self.router.engine_stats_interval_s


async def test_big_bodies_are_keyed_on_the_worker_thread_small_ones_on_the_loop() -> None:
    recorder = ThreadRecorder()
    sys.setswitchinterval(0.005)  # CPython's default, whatever an earlier test left
    switch_interval_s = sys.getswitchinterval()
    async with backends_running("a") as backends:
        config = gateway_config(backends, limits={"offload_body_bytes": 4096})
        async with gateway_running(config, recorder) as gw:
            assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
            loop_thread = threading.current_thread().name
            small = chat([{"role": "user", "content": "x" * 1000}])
            big = chat([{"role": "user", "content": "x" * 5000}])
            for body in (small, big, small):
                assert (await post(gw.url, CHAT, body))[0] == 200
            assert recorder.threads[0] == recorder.threads[2] == loop_thread
            assert recorder.threads[1].startswith("warmfleet-body")
            bad = json.dumps(chat([{"role": "user", "content": 5}], pad="x" * 5000))
            status, answer = await post(gw.url, CHAT, bad.encode())
            assert (status, answer["error"]["param"]) == (400, "messages[0].content")
    assert not any(t.name.startswith("warmfleet-body") for t in threading.enumerate())
    assert sys.getswitchinterval() == switch_interval_s


def big_values_body(values: int) -> bytes:
    parts = [{"type": "text", "text": f"p{i}, with a comma"} for i in range(values // 3)]
    return json.dumps(chat([{"role": "user", "content": parts}])).encode()


PAD = b'"pad": "' + b", " * FAST_PARSE_MAX_VALUES + b'"'


@pytest.mark.parametrize(
    "raw",
    [
        big_values_body(3 * FAST_PARSE_MAX_VALUES),
        b'{"a": [1, 2.5e300, 123456789012345678901234567890, "\\u00e9\\ud83d\\ude00", '
        b'"\\ud800", null, true, -0.0, 1e-7], "b": {}, "b": {"c": []}, ' + PAD + b"}",
        b'{"n": NaN, "i": -Infinity, ' + PAD + b"}",
    ],
    ids=["many values", "numbers and strings", "nan"],
)
def test_the_yielding_parser_gives_the_same_values(raw: bytes) -> None:
    assert json.dumps(loads_body_yielding(raw)) == json.dumps(loads_body(raw))


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xff" + b"," * 30_000, b"[" * 30_000, b'{"a": [1,2,' + b"," * 30_000 + b"]}"],
    ids=["empty", "not utf-8", "deep", "malformed"],
)
def test_the_yielding_parser_refuses_with_a_400(raw: bytes) -> None:
    with pytest.raises(BadRequestError) as caught:
        loads_body_yielding(raw)
    assert caught.value.param == "body"


# --------------------------------------------------------------------------------------------
# Short GIL holds: counted and freed in steps


@pytest.mark.parametrize(
    "size", [0, 1, COUNT_STEP_BYTES - 1, COUNT_STEP_BYTES, 3 * COUNT_STEP_BYTES + 7]
)
def test_the_value_bound_counts_in_steps_what_one_count_would(size: int) -> None:
    raw = bytes(random.Random(size).choices(b'{[,]}" a', k=size))
    expected = raw.count(b",") + raw.count(b"{") + raw.count(b"[") + 1
    assert value_bound(raw) == expected


class Sentinel:
    """A value that says when it is freed (dicts and lists take no weak references)."""


def test_a_body_freed_in_steps_is_freed_whole() -> None:
    step = 4
    deep = [[Sentinel()]]  # short containers go with their slice
    long_child = [Sentinel() for _ in range(3 * step)]  # longer than a step: emptied in steps
    leaf = Sentinel()
    body: dict[str, object] = {"a": [{"k": deep}, *range(10)], "b": long_child, "c": leaf}
    watched = [weakref.ref(deep[0][0]), weakref.ref(long_child[0]), weakref.ref(leaf)]
    del deep, leaf
    free_in_steps(body, step)
    assert long_child == []
    assert body == {}
    assert [ref() for ref in watched] == [None, None, None]


def test_a_long_list_under_short_containers_is_emptied_in_steps_too() -> None:
    """A chat of one message whose content holds many parts: the messages list and the message
    are short, the parts list under them is still cut in steps (freed with the message's
    slice it would be one call)."""
    parts = [{"type": "text", "text": str(i)} for i in range(40)]
    body: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    free_in_steps(body, 4)
    assert parts == []
