"""How late the event loop runs: a timer due every `PERIOD_S`, its lateness recorded.

A stream's chunk, a scrape's answer and a new request all wait for the loop; while one step of
work holds it (parsing a big body, a long routing decision, a blocking call by mistake), every
one of them waits that long on top of its own pace. The lateness of a timer the loop should run
every 25 ms measures exactly that wait, as `kvgate_event_loop_lag_seconds` on `/metrics`. It
costs about 40 wake-ups a second.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from gateway.keys import TELEMETRY

PERIOD_S = 0.025


async def watch(record: Callable[[float], None], period: float = PERIOD_S) -> None:
    """Records, every `period`, how late the loop woke up for it (runs until cancelled)."""
    loop = asyncio.get_running_loop()
    due = loop.time() + period
    while True:
        await asyncio.sleep(max(0.0, due - loop.time()))
        now = loop.time()
        record(max(0.0, now - due))
        due = now + period


async def loop_watching(app: web.Application) -> AsyncIterator[None]:
    """The watch, for the app's lifetime (a cleanup context)."""
    task = asyncio.create_task(watch(app[TELEMETRY].loop_lagged), name="kvgate-loop-watch")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
