"""Token coalescing: reading and writing a long stream a few tokens at a time.

With `server.stream_flush_interval_ms` above 0, a stream's first content event goes out at once
(the time to first token is never delayed); from then on the relay reads its upstream only on a
tick of that interval. Between two ticks the upstream connection's reading is paused, so the
tokens the backend sends meanwhile wait in the kernel's socket buffer and arrive in one read,
are scanned once (gateway/sse.py) and leave in one write: the per-read and per-write costs (a
system call, the HTTP parser, an event-loop wake-up, the scan) are paid once per tick instead of
once per token. A token waits at most one interval for its tick, so the inter-token latency the
client sees grows by at most the interval, while a stream's idle timeout, its end, its errors and
a client hanging up behave as without coalescing (only noticed up to one interval later).

`FlushTicker` is one clock for every coalesced stream of the event loop: a tick is one timer,
whatever the number of streams waiting on it, and the streams it wakes are handled together.
"""

from __future__ import annotations

import asyncio
import math

__all__ = ["FlushTicker", "pause_reading", "resume_reading"]


class FlushTicker:
    """Ticks every `interval_s` on a fixed grid while any stream waits for it."""

    __slots__ = ("_interval", "_loop", "_waiters")

    def __init__(self, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"a flush interval must be positive, got {interval_s!r}")
        self._interval = interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        # The futures of the streams waiting for the next tick; None while no tick is due.
        self._waiters: list[asyncio.Future[None]] | None = None

    @property
    def interval_s(self) -> float:
        return self._interval

    def next_tick(self) -> asyncio.Future[None]:
        """A future resolved at the next tick. Each caller gets its own, so a waiter that is
        cancelled (its client hung up) cancels nobody else's wait."""
        waiters = self._waiters
        if waiters is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            waiters = self._waiters = []
            loop.call_at(_next_on_grid(loop.time(), self._interval), self._tick)
        else:
            loop = self._loop
            assert loop is not None
        future: asyncio.Future[None] = loop.create_future()
        waiters.append(future)
        return future

    def _tick(self) -> None:
        waiters, self._waiters = self._waiters, None
        for future in waiters or ():
            if not future.done():
                future.set_result(None)


def _next_on_grid(now: float, interval: float) -> float:
    return (math.floor(now / interval) + 1.0) * interval


def pause_reading(transport: asyncio.BaseTransport | None) -> None:
    """Leaves what the peer sends in the kernel's buffer until `resume_reading`."""
    if transport is not None and not transport.is_closing():
        reader = getattr(transport, "pause_reading", None)
        if reader is not None:
            reader()


def resume_reading(transport: asyncio.BaseTransport | None) -> None:
    if transport is not None and not transport.is_closing():
        reader = getattr(transport, "resume_reading", None)
        if reader is not None:
            reader()
