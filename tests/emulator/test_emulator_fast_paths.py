"""The emulator's per-request fast paths give exactly what the plain implementations give.

Prefix-memoised tokenization, part-wise chat encoding, batched SSE chunks, per-request token
events and trimmed token events of the engine, and the driver's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from typing import Any

import uvloop
import xxhash
from emulator_support import DRIVER_SPEC
from hypothesis import given, settings
from hypothesis import strategies as st

from warmfleet.emulator.driver import EngineDriver
from warmfleet.emulator.protocol import Choice, Job
from warmfleet.emulator.responses import ChunkWriter
from warmfleet.emulator.tokenizer import (
    SPECIAL_IDS,
    EmulatorTokenizer,
    output_piece,
    output_pieces_json,
    render_chat,
)
from warmfleet.engine.events import EngineEvent, EngineEventKind, EngineRequest
from warmfleet.engine.model import EngineModel

# ------------------------------------------------------------------ reference tokenizer

_PIECE = re.compile(r"\s*\S{1,4}|\s+")
_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_IDS) + ")")


def _ref_plain(text: str) -> list[int]:
    return [
        64 + xxhash.xxh3_64_intdigest(p.encode("utf-8", "replace")) % (128_000 - 64)
        for p in _PIECE.findall(text)
    ]


def _ref_encode(text: str) -> list[int]:
    out: list[int] = []
    for i, part in enumerate(_SPECIAL.split(text)):
        out.extend([SPECIAL_IDS[part]] if i % 2 else _ref_plain(part))
    return out


_ATOMS = [
    "a",
    "bc",
    "defgh",
    " ",
    "  ",
    "\n",
    "\t ",
    "é",
    "<|",
    "|>",
    "eot_id",
    "<|eot_id|>",
    "x y",
]
_chunky_text = st.lists(st.sampled_from(_ATOMS), max_size=120).map("".join)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 9),
    _chunky_text,
    st.lists(st.tuples(st.integers(0, 400), _chunky_text), min_size=1, max_size=6),
)
def test_prefix_memoised_encoding_equals_plain_findall(
    step: int, base: str, variants: list[tuple[int, str]]
) -> None:
    """Texts sharing prefixes of every length, through one tokenizer (so caches are hit)."""
    tok = EmulatorTokenizer(prefix_step_chars=step)
    for cut, tail in variants:
        text = (base * 4)[:cut] + tail
        for _ in range(2):  # the second time from the caches
            assert tok.encode_plain(text) == _ref_plain(text)
            assert tok.encode(text) == _ref_encode(text)


def test_long_prompts_sharing_a_prefix_resume_from_the_memoised_prefix() -> None:
    tok = EmulatorTokenizer()
    shared = " ".join(f"w{i % 97}abcdef" for i in range(800))
    for question in ("  what\n\nnow ", "x" * 700, " tail"):
        assert tok.encode_plain(shared + question) == _ref_plain(shared + question)
    assert len(tok._prefixes) > 0


_role = st.sampled_from(["user", "system", "<|eot", "a<|", "|>b"])
_message = st.fixed_dictionaries({"role": _role, "content": _chunky_text})


@settings(max_examples=120, deadline=None)
@given(st.lists(_message, min_size=1, max_size=4), st.booleans(), st.booleans())
def test_chat_encoding_equals_encoding_the_rendered_template(
    messages: list[dict[str, str]], generation_prompt: bool, with_tools: bool
) -> None:
    tools: list[Any] | None = [{"type": "function", "name": "<|eot_id|>"}] if with_tools else None
    tok = EmulatorTokenizer(prefix_step_chars=3)
    expected = _ref_encode(render_chat(messages, generation_prompt, tools))
    got = tok.encode_chat(messages, add_generation_prompt=generation_prompt, tools=tools)
    assert got == expected


# ------------------------------------------------------------------ SSE chunks


def _job(kind: str, output_tokens: int, finish_reason: str, seed: int) -> Job:
    return Job(
        kind,  # type: ignore[arg-type]
        "chatcmpl-x" if kind == "chat" else "cmpl-x",
        "m",
        [1, 2, 3],
        (),
        (Choice(0, seed, output_tokens, finish_reason),),
        True,
        True,
    )


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from(["chat", "completion"]),
    st.integers(1, 40),
    st.sampled_from(["length", "stop"]),
    st.integers(0, 2**64 - 1),
    st.data(),
)
def test_batched_token_chunks_are_one_chunk_per_token(
    kind: str, output_tokens: int, finish_reason: str, seed: int, data: st.DataObject
) -> None:
    writer = ChunkWriter(_job(kind, output_tokens, finish_reason, seed))
    cuts = sorted(data.draw(st.sets(st.integers(1, output_tokens - 1), max_size=5)) if
                  output_tokens > 1 else set())  # fmt: skip
    bounds = [0, *cuts, output_tokens]
    stream = b"".join(writer.tokens(a, b) for a, b in itertools.pairwise(bounds))
    assert stream == writer.tokens(0, output_tokens)
    chunks = [c for c in stream.split(b"\n\n") if c]
    assert len(chunks) == output_tokens
    for index, chunk in enumerate(chunks):
        assert chunk.startswith(b"data: ")
        choice = json.loads(chunk[6:])["choices"][0]
        text = choice["delta"]["content"] if kind == "chat" else choice["text"]
        assert text == output_piece(seed, index)
        last = index == output_tokens - 1
        assert choice["finish_reason"] == (finish_reason if last else None)
    texts = output_pieces_json(seed, 0, output_tokens)
    assert [json.loads(t) for t in texts] == [output_piece(seed, i) for i in range(output_tokens)]


# ------------------------------------------------------------------ engine token events


_arrivals = st.lists(
    st.tuples(st.floats(0, 0.3), st.integers(1, 40), st.integers(1, 30), st.booleans()),
    min_size=1,
    max_size=8,
)


def _run(
    arrivals: list[tuple[float, int, int, bool]],
    polls: list[float],
    steps: int | None,
    use_flag: bool,
) -> list[EngineEvent]:
    model = EngineModel(DRIVER_SPEC, emit_token_events=True, token_event_steps=steps)
    events: list[EngineEvent] = []
    todo = sorted((at, i, p, o, t) for i, (at, p, o, t) in enumerate(arrivals))
    for now in sorted({*polls, *(a[0] for a in todo), 10.0}):
        events += model.advance(now)
        while todo and todo[0][0] <= now:
            _at, rid, prompt, output, tokens = todo.pop(0)
            req = EngineRequest(rid, (), prompt, output, token_events=tokens or not use_flag)
            model.submit(req, now)
    return events + model.advance(20.0)


def _view(events: list[EngineEvent], wanted: set[int]) -> dict[int, tuple[Any, ...]]:
    """What the driver keeps per request: non-token events, latest count, last token gap."""
    out: dict[int, tuple[Any, ...]] = {}
    for rid in {e.request_id for e in events}:
        mine = [e for e in events if e.request_id == rid]
        major = [e for e in mine if e.kind is not EngineEventKind.TOKEN]
        tokens = [e for e in mine if e.kind is EngineEventKind.TOKEN] if rid in wanted else []
        times = [e.time_s for e in mine if e.kind is not EngineEventKind.FINISHED]
        gap = times[-1] - times[-2] if rid in wanted and len(times) > 1 else None
        out[rid] = (major, tokens[-1] if tokens else None, gap)
    return out


@settings(max_examples=80, deadline=None)
@given(_arrivals, st.lists(st.floats(0, 2), max_size=12))
def test_trimmed_and_per_request_token_events_keep_what_the_driver_uses(
    arrivals: list[tuple[float, int, int, bool]], polls: list[float]
) -> None:
    full = _run(arrivals, polls, None, use_flag=False)
    wanted = {i for i, a in enumerate(arrivals) if a[3]}
    for steps in (None, 2):
        trimmed = _run(arrivals, polls, steps, use_flag=True)
        assert not any(
            e.kind is EngineEventKind.TOKEN and e.request_id not in wanted for e in trimmed
        )
        assert _view(trimmed, wanted) == _view(full, wanted)


# ------------------------------------------------------------------ driver clock


def test_fast_driver_does_not_spin_on_a_millisecond_loop_clock() -> None:
    """uvloop's loop.time() has millisecond steps; the driver's clock must not (at a speed-up
    of 1e6 a request's events are sub-microsecond apart: a few wake-ups serve it)."""

    async def main() -> int:
        driver = EngineDriver(DRIVER_SPEC, speedup=1e6)
        calls = 0
        catch_up = driver._catch_up

        def counting() -> float:
            nonlocal calls
            calls += 1
            return catch_up()

        driver._catch_up = counting  # type: ignore[method-assign]
        task = asyncio.create_task(driver.run())
        for rid in range(5):
            stream = driver.submit((rid,), 40, 8, wants_tokens=False)
            while not stream.done:
                await stream.next_batch()
        task.cancel()
        return calls

    assert uvloop.run(main()) <= 5 * 12
