"""Parsing request bodies at the edge: strict JSON, and a bound on the work a body may cost.
(Size limit and slow senders are the HTTP layer's, ``wire.py``.)

``parse_request_body`` parses and checks the limits of ``LimitsConfig``: JSON nesting depth,
a chat's messages (a Responses body's input items) and content parts, a completions (or
embeddings) batch's prompts (each a 400 naming the param). It and the routing key are pure and
synchronous; the handlers run them inline for small bodies and on ``BodyWorker``, one thread
owned by the gateway runtime, for bodies over ``limits.offload_body_bytes``. One thread:
requests with big bodies queue for it, and the event loop thread waits for the GIL at most one
switch interval per acquisition (plus whatever single C call the worker is in:
``jsonio.loads_body_yielding`` keeps those short).
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Literal, TypeVar

from warmfleet.core.errors import BadRequestError
from warmfleet.core.jsonio import deepest_field, loads_body, loads_body_yielding
from warmfleet.gateway.server_config import LimitsConfig

T = TypeVar("T")

# The GIL switch interval while a body worker runs (CPython's default: 5 ms). The event loop
# thread wakes for every socket event; each time the worker runs Python it waits up to this
# long for the GIL, so at 5 ms a busy worker made /health take 100-250 ms under 4 clients
# sending 7.5 MB bodies, and at 0.2 ms 1-40 ms (docs/gateway.md, "Expensive bodies").
SWITCH_INTERVAL_S = 0.0002
FREE_STEP_ITEMS = 256  # items a C call of ``free_in_steps`` frees (with their subtrees)
OPEN_DEPTH = 3  # levels ``free_in_steps`` opens whatever their length: body, messages, message


def parse_json_object(raw: bytes, *, yielding: bool = False) -> dict[str, Any]:
    """Strict UTF-8 JSON whose top level is an object (see ``loads_body``); ``yielding``: parsed
    without holding the GIL for long (``loads_body_yielding``, for the body worker)."""
    body = loads_body_yielding(raw) if yielding else loads_body(raw)
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", param="body")
    return body


# What ``parse_request_body`` counts per kind of body: the field holding a chat's messages (or
# a Responses body's input items: both are counted against ``max_messages`` and
# ``max_content_parts``) and the field holding a batch of prompts (``max_prompts``).
BodyKind = Literal["chat", "completions", "responses", "embeddings", "tokenize", "detokenize"]
_COUNTED: dict[str, tuple[str | None, str | None]] = {
    "chat": ("messages", None),
    "completions": (None, "prompt"),
    "responses": ("input", None),
    "embeddings": (None, "input"),
    "tokenize": ("messages", "prompt"),
    "detokenize": (None, None),
}


def parse_request_body(
    raw: bytes, limits: LimitsConfig, *, kind: BodyKind, yielding: bool = False
) -> dict[str, Any]:
    """A body of ``kind``, parsed and within ``limits`` (else 400 naming the param). The counts
    are skipped when the body is too short to break them."""
    body = parse_json_object(raw, yielding=yielding)
    messages, prompts = _COUNTED[kind]
    if messages is not None:
        _check_chat(body, messages, len(raw), limits)
    if prompts is not None:
        _check_prompts(body, prompts, limits)
    max_depth = limits.max_json_depth
    # A walk of the containers (~150 ns each: 0.7 us for a plain chat, 40 us for 30 tools and
    # 40 messages). Counting the brackets first to skip it cost more: ~0.7 ns per byte.
    field = deepest_field(body, max_depth)
    if field is not None:
        raise BadRequestError(
            f"'{field}' nests JSON deeper than limits.max_json_depth ({max_depth}) levels",
            param=field,
        )
    return body


def _check_chat(body: dict[str, Any], name: str, size_bytes: int, limits: LimitsConfig) -> None:
    messages = body.get(name)
    if type(messages) is not list:
        return  # the routing key names the error
    if len(messages) > limits.max_messages:
        raise BadRequestError(
            f"'{name}' has {len(messages)} messages, over limits.max_messages "
            f"({limits.max_messages})",
            param=name,
        )
    max_parts = limits.max_content_parts
    if size_bytes <= 2 * max_parts:  # n array elements take at least 2n - 1 bytes
        return
    parts = 0
    for message in messages:
        if type(message) is dict:
            content = message.get("content")
            if type(content) is list:
                parts += len(content)
            output = message.get("output")  # a Responses function_call_output's parts
            if type(output) is list:
                parts += len(output)
    if parts > max_parts:
        raise BadRequestError(
            f"'{name}' has {parts} content parts in all, over limits.max_content_parts "
            f"({max_parts})",
            param=name,
        )


def _check_prompts(body: dict[str, Any], name: str, limits: LimitsConfig) -> None:
    """A batch (an array of strings or of token-id arrays) holds at most ``max_prompts``."""
    prompt = body.get(name)
    if type(prompt) is list and len(prompt) > limits.max_prompts and type(prompt[0]) is not int:
        raise BadRequestError(
            f"'{name}' is a batch of {len(prompt)} prompts, over limits.max_prompts "
            f"({limits.max_prompts})",
            param=name,
        )


def check_key_body_size(size_bytes: int, mode: str, limits: LimitsConfig) -> None:
    """A body over ``limits.max_key_body_bytes`` for the variant's key mode: 400."""
    allowed: int = getattr(limits.max_key_body_bytes, mode)
    if size_bytes > allowed:
        raise BadRequestError(
            f"request body of {size_bytes} bytes is over limits.max_key_body_bytes.{mode} "
            f"({allowed}) for this variant's key mode",
            param="body",
        )


def openai_fields(body: dict[str, Any]) -> tuple[str, bool]:
    """``model`` (non-empty string) and ``stream`` (boolean, default false)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("'model' is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequestError("'stream' must be a boolean", param="stream")
    return model, stream


def yield_gil() -> None:
    """Let a thread waiting for the GIL (the event loop's) take it. Code compiled by mypyc, as
    this module and the key builders are, never checks for a GIL drop request: a compiled call
    holds the GIL until it returns (the body worker's parse, key and free of a 7.5 MB body were
    15-40 ms in one hold here). ``time.sleep(0)`` releases it."""
    time.sleep(0)


def free_in_steps(value: object, step: int = FREE_STEP_ITEMS) -> None:
    """Empty a parsed JSON ``value``'s containers ``step`` items at a time, so that no single C
    call frees the whole body: dropping a body is one deallocation cascade holding the GIL
    (4-11 ms for 49,000 content parts here, more beside a busy loop thread). A list is cut from
    its end ``step`` items a call, the GIL released after every ``step`` items freed. Every
    container down to ``OPEN_DEPTH`` levels (a chat's messages) is opened, deeper ones only when
    longer than ``step`` (shorter ones go with their slice: 256 content parts are ~0.1 ms); a
    deep tree of short containers still goes in one call. The containers opened end empty: the
    caller must not need them any more."""
    stack: list[tuple[object, int]] = [(value, 0)]
    freed = 0
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            values = list(item.values())
            item.clear()  # its keys go now (strings), its values with the list below
            item = values
        if type(item) is not list:
            continue
        opened = depth < OPEN_DEPTH
        while item:
            chunk = item[-step:]
            del item[-step:]
            for child in chunk:
                if (type(child) is list or type(child) is dict) and (opened or len(child) > step):
                    stack.append((child, depth + 1))
            freed += len(chunk)
            del chunk  # its scalars and unopened containers
            if freed >= step:
                freed = 0
                yield_gil()


def _free_holder(holder: list[Any]) -> None:
    while holder:
        free_in_steps(holder.pop())


def _forgetting(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; an exception leaves without the locals of its frames (a parsed body would
    otherwise be freed wherever the exception ends: on the event loop)."""
    try:
        return fn(*args)
    except BaseException as err:
        traceback.clear_frames(err.__traceback__)
        raise


class BodyWorker:
    """The one thread that parses and keys big bodies (module docstring). Started and stopped
    by the gateway runtime's lifespan."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._previous_switch_interval_s: float | None = None
        self._lowered_switch_interval_s = 0.0  # as read back: CPython keeps whole microseconds

    @property
    def running(self) -> bool:
        return self._executor is not None

    def start(self) -> None:
        """Start the thread and lower the interpreter's GIL switch interval to
        ``SWITCH_INTERVAL_S`` (it only matters while two threads want the GIL: the small-body
        hot path, alone on it, never pays it)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="warmfleet-body")
            previous = sys.getswitchinterval()
            if previous > SWITCH_INTERVAL_S:
                self._previous_switch_interval_s = previous
                sys.setswitchinterval(SWITCH_INTERVAL_S)
                self._lowered_switch_interval_s = sys.getswitchinterval()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker thread. Cancelling the caller drops a job that has not
        started (a client that left); a running one finishes and its result is dropped."""
        executor = self._executor
        if executor is None:
            raise RuntimeError("body worker not started")
        job = partial(_forgetting, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(executor, job)

    def discard(self, holder: list[Any]) -> None:
        """Empty ``holder`` on the worker thread (its content is freed there, in steps: see
        ``free_in_steps``), not waited for."""
        executor = self._executor
        if executor is not None:
            executor.submit(_free_holder, holder)

    async def stop(self) -> None:
        """Drop the queued jobs, let the running one end, and join the thread (waited for on
        the default executor, so the event loop is never blocked)."""
        executor, self._executor = self._executor, None
        previous, self._previous_switch_interval_s = self._previous_switch_interval_s, None
        # (unless someone else changed it since; SWITCH_INTERVAL_S reads back as 199.99... µs)
        if previous is not None and sys.getswitchinterval() == self._lowered_switch_interval_s:
            sys.setswitchinterval(previous)
        if executor is not None:
            shutdown = partial(executor.shutdown, wait=True, cancel_futures=True)
            await asyncio.get_running_loop().run_in_executor(None, shutdown)
