"""Waiting for state in a test: poll a predicate until it holds, failing after a deadline.

A test never sleeps a fixed time and hopes the state has arrived (too short on a loaded host,
wasted on an idle one); it names what it waits for and polls it. The deadline is generous: it
only bounds how long a broken test takes to fail, never how fast a passing one must be.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEADLINE_S = 15.0
INTERVAL_S = 0.005


async def until(predicate: Callable[[], bool | Awaitable[bool]], what: str,
                timeout_s: float = DEADLINE_S) -> None:
    """Returns once `predicate()` (a plain or an async function) is true; fails the test,
    naming `what`, when it is still false after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(INTERVAL_S)
