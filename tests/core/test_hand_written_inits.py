"""The hot value types write their own ``__init__`` (``init=False``, docs/compiled.md): each
must take exactly the dataclass's fields, in order, with the same meaning, so that positional
construction, keywords and ``dataclasses.replace`` behave as a generated one would. Checked by
behaviour, not signature: a compiled ``__init__`` has none to inspect."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from warmfleet.core.types import Decision, FleetSnapshot, InstanceState, Reason, RoutingKey
from warmfleet.gateway.replica_sync.transport import Batch
from warmfleet.routing.replica_notes import FinishedNote, RoutedNote
from warmfleet.routing.request import NO_OPTIONS, ChatRequest, CompletionsRequest, NativeRequest
from warmfleet.routing.strategies.affinity_view import Columns, View

KEY = RoutingKey((1, 2), 4, 9, 9, 7, 3, 11, 13)
DECISION = Decision("a", Reason.PREFIX_HIT, 2, 2, True)
SAMPLES: dict[type[Any], tuple[Any, ...]] = {
    RoutingKey: ((1, 2), 4, 9, 9, 7, 3, 11, 13),
    InstanceState: ("a", 1, 2, 3, 0.5, 6),
    FleetSnapshot: ((InstanceState("a"),), 1.5),
    Decision: ("a", Reason.PREFIX_HIT, 2, 2, True),
    RoutedNote: ("o", "e/v", 3, KEY, DECISION, 12),
    FinishedNote: ("o", "e/v", 3, "a", 12),
    Batch: ("o", 1.0, 2, b"", ()),
    ChatRequest: ("m", "t", "s", 7, [{"role": "user", "content": "hi"}], [], {"x": 1}, "se"),
    CompletionsRequest: ("m", None, None, 7, ["a", "b"], {"y": 2}, "se"),
    NativeRequest: (b"{}", "m", "t", "se"),
}
# The parsed chats and completions hold the body's lists and mappings: never hashed.
UNHASHABLE = (ChatRequest, CompletionsRequest)


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_init_takes_the_fields_in_order(cls: type[Any]) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    values = SAMPLES[cls]
    built = cls(*values)
    assert [getattr(built, name) for name in names] == list(values)
    assert built == cls(**dict(zip(names, values, strict=True)))
    if cls not in UNHASHABLE:
        assert hash(built) == hash(cls(*values))
    changed = dataclasses.replace(built, **{names[0]: values[0]})
    assert changed == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, names[0], values[0])


def test_defaults_are_the_documented_ones() -> None:
    assert ChatRequest("m", None, None, 0, [], None) == ChatRequest(
        "m", None, None, 0, [], None, NO_OPTIONS, None
    )
    assert CompletionsRequest("m", None, None, 0, []) == CompletionsRequest(
        "m", None, None, 0, [], NO_OPTIONS, None
    )
    assert NativeRequest(b"", "m", None) == NativeRequest(b"", "m", None, None)
    assert InstanceState("a") == InstanceState("a", 0, 0, 0, 0.0, 0)
    assert Decision("a", Reason.RANDOM) == Decision("a", Reason.RANDOM, 0, 0, False)
    assert RoutingKey((), 1, 0, 0, 0) == RoutingKey((), 1, 0, 0, 0, 0, None, None)
    assert FleetSnapshot(()).now_s == 0.0


VIEW_ARGS: dict[type[Any], dict[str, Any]] = {
    Columns: {"ids": ("a",), "pos": {"a": 0}, "tokens": (5,), "counts": (1,)},
    View: {
        "ids": ("a",), "loads": [3], "pos": {"a": 0}, "matches": {"a": 2}, "best_blocks": 2,
        "work": 9, "cap_load": 4.5, "tokens_per_block": 16.0,
    },
}  # fmt: skip


@pytest.mark.parametrize("cls", list(VIEW_ARGS), ids=lambda c: c.__name__)
def test_views_set_every_slot(cls: type[Any]) -> None:
    built = cls(**VIEW_ARGS[cls])  # a parameter missing or extra: TypeError
    assert {name: getattr(built, name) for name in VIEW_ARGS[cls]} == VIEW_ARGS[cls]
