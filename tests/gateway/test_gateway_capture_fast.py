"""The capture's cheap paths pin the same behaviour as the plain ones: the orjson line is the
standard library's text byte for byte (else the standard library writes it), and the writer
gathers lines into few hand-offs to its thread without ever losing one to the wait."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import warmfleet.gateway.capture as capture_module
from support.waiting import wait_until
from warmfleet.api.trace_format import record_line
from warmfleet.core.types import Decision, Reason, RoutingKey
from warmfleet.gateway.capture import Capture, CaptureMetrics
from warmfleet.gateway.capture_config import CaptureConfig
from warmfleet.gateway.capture_file import (
    Captured,
    CaptureFile,
    RecordMaker,
    WriteResult,
    _ms,
    usage_of,
)
from warmfleet.gateway.relay import Attempt, Relay

U64_MAX = (1 << 64) - 1


def _item(**changes: Any) -> Captured:
    key = RoutingKey((1, U64_MAX, 1 << 63, 42), 16, 64, 64, 7, output_tokens_hint=8, session=5)
    decision = Decision("inst-0", Reason.PREFIX_HIT, predicted_cached_blocks=2)
    item = Captured(
        10.0, 10.0123456, 10.25, key, decision, "inst-0", "v1", "salt", 200,
        b'"usage":{"prompt_tokens":60,"completion_tokens":3}', "acme", "m",
    )  # fmt: skip
    return item._replace(**changes)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tenant": None, "usage": None, "t_first_s": 0.0, "status": 0},
        {"model": "mod\u00e8le", "instance": "n\u00f6de"},  # not ASCII: the standard library's
        {"variant": 'v"\\\x01'},  # escapes, alike in both
        {"key": RoutingKey((1 << 64, 3), 16, 32, 32, 7)},  # past 64 bits: the standard library's
        {"model": "x" * 513, "instance": "i" * 257},  # too long for the format: left out
        {"t_end_s": 2e13},  # a float past where the formats part
        {"priority": -3, "deadline_ms": 1500.25, "predicted_ttft_s": 0.0123456},  # flow control
        {"priority": 0, "deadline_ms": 1e-9, "predicted_ttft_s": 0.0},  # a deadline under 1 µs
    ],
)
def test_the_line_bytes_are_record_line_of_the_record(changes: dict[str, Any]) -> None:
    item = _item(**changes)
    maker = RecordMaker()
    record = maker.record(item, 9.5)
    for name, limit in (("model", 512), ("instance", 256), ("variant", 256)):
        if record[name] is not None and len(record[name]) > limit:
            record[name] = None
    expected = record_line(record)
    assert maker.line_bytes(item, 9.5) == (expected + "\n").encode()
    assert maker.line(item, 9.5) == expected


@settings(max_examples=300, deadline=None)
@given(st.floats(0.0, 1e11), st.floats(0.0, 1e11), st.floats(0.0, 1e15, exclude_max=True))
def test_orjson_writes_the_rounded_times_as_repr_does(
    start_s: float, end_s: float, below_limit_ms: float
) -> None:
    """Every float of a line (``_ms``: rounded to the microsecond) under the fast path's limit
    (unrounded, orjson and ``repr`` part below 1e-4: 0.00005 against 5e-05)."""
    for value in (_ms(start_s, end_s), round(below_limit_ms, 3)):
        assert orjson.dumps(value) == json.dumps(value).encode()


def _offer(capture: Capture, count: int) -> None:
    """``count`` answered requests offered as the proxy offers them."""
    variant = SimpleNamespace(
        name="v1", routing_config=SimpleNamespace(key=SimpleNamespace(salt="s", tenant_header="X"))
    )
    item = _item()
    for i in range(count):
        call = SimpleNamespace(
            model="m", variant=variant, key=item.key, decision=item.decision, t_start=float(i),
            inst=SimpleNamespace(instance_id="inst-0"), request=SimpleNamespace(headers={}),
            ticket=None,
        )  # fmt: skip
        relay = SimpleNamespace(last=b"{}", tail=b"", t_first=i + 0.01)
        capture.offer(cast("Attempt", call), cast("Relay", relay), 200)


class _Recorded:
    """CaptureFile.write replaced: the batches it was handed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[int] = []
        real = CaptureFile.write

        def write(file: CaptureFile, items: Sequence[Captured], header: str) -> WriteResult:
            self.batches.append(len(items))
            return real(file, items, header)

        monkeypatch.setattr(CaptureFile, "write", write)


async def _running(capture: Capture) -> asyncio.Task[None]:
    task = asyncio.create_task(capture.run())
    await asyncio.sleep(0)
    return task


async def test_lines_offered_together_reach_the_file_in_one_hand_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = _Recorded(monkeypatch)
    monkeypatch.setattr(capture_module, "_GATHER_S", 30.0)  # only a batch or the close wakes it
    config = CaptureConfig(path=str(tmp_path / "c.jsonl"), queue_size=64)
    capture = Capture(config, CaptureMetrics(_registry()), lambda: '{"warmfleet_trace":1}')
    task = await _running(capture)
    _offer(capture, 20)  # under half the queue: the writer keeps gathering
    await asyncio.sleep(0.05)
    assert recorded.batches == []
    _offer(capture, 12)  # half the queue: it writes now, all of them at once
    await wait_until(lambda: recorded.batches == [32])
    capture.close()
    await asyncio.wait_for(task, 10)
    assert capture.metrics.dropped.value == 0
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 1 + 32


async def test_closing_writes_what_was_gathering_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = _Recorded(monkeypatch)
    monkeypatch.setattr(capture_module, "_GATHER_S", 30.0)
    config = CaptureConfig(path=str(tmp_path / "c.jsonl"))
    capture = Capture(config, CaptureMetrics(_registry()), lambda: '{"warmfleet_trace":1}')
    task = await _running(capture)
    _offer(capture, 3)
    await asyncio.sleep(0.01)
    capture.close()
    await asyncio.wait_for(task, 10)  # not the 30 s of the gathering
    assert recorded.batches == [3]


def _registry() -> CollectorRegistry:
    return CollectorRegistry()


def _usage_by_the_standard_library(snippet: bytes) -> tuple[int | None, int | None, int | None]:
    """``usage_of`` as it was: ``json`` reads the value after the first colon."""
    colon = snippet.find(b":")
    try:
        value, _end = json.JSONDecoder().raw_decode(snippet[colon + 1 :].decode().lstrip())
    except (ValueError, UnicodeDecodeError):
        return None, None, None
    if not isinstance(value, dict):
        return None, None, None

    def count(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    details = value.get("prompt_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return count(value.get("prompt_tokens")), count(value.get("completion_tokens")), cached


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text('{}[]",:\\ab'),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text('{}"ab'), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["prompt_tokens", "completion_tokens", "prompt_tokens_details", "x{"]),
        _JSON_VALUES | st.fixed_dictionaries({"cached_tokens": st.integers(0, 10**6)}),
        max_size=4,
    ),
    st.sampled_from([b"}", b"}\n\ndata: [DONE]\n\n", b',"x":{"y":1}}', b"", b"{", b"}}}"]),
    st.sampled_from([b'"usage":', b'"usage": ', b'"usage":\n']),
)
def test_usage_of_reads_what_the_standard_library_reads(
    usage: dict[str, Any], after: bytes, head: bytes
) -> None:
    """orjson's fast read (where the braces balance) gives ``raw_decode``'s answer, braces in
    strings, past-64-bit numbers and trailing data included."""
    snippet = head + json.dumps(usage).encode() + after
    assert usage_of(snippet) == _usage_by_the_standard_library(snippet)
    for cut in (len(snippet) // 2, len(snippet) - 1):  # a snippet cut at USAGE_BYTES
        assert usage_of(snippet[:cut]) == _usage_by_the_standard_library(snippet[:cut])
    for other in (b'"usage":null}', b'"usage":[1,2]}', b'"usage":"{}"}', b'"usage":\xff{}'):
        assert usage_of(other) == _usage_by_the_standard_library(other)
