"""Waiting for a condition with a deadline: a liveness bound for a test, not a timing assertion
(the deadline only turns a hang into a failure that says what never happened)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float = 20.0,
    step_s: float = 0.01,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` (a function, or a coroutine function) every ``step_s`` until it holds;
    ``AssertionError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(step_s)


def wait_until_sync(
    predicate: Callable[[], bool],
    *,
    timeout_s: float = 20.0,
    step_s: float = 0.02,
    what: str = "condition",
) -> None:
    """``wait_until`` for a test outside an event loop (a server in a thread or a process)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(step_s)
