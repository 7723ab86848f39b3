"""The flush ticker: one tick on a fixed grid wakes every stream waiting for it, a waiter that is
cancelled cancels nobody else's wait, and no timer runs while nobody waits."""

from __future__ import annotations

import asyncio
import math

import pytest

from gateway.coalesce import FlushTicker

INTERVAL_S = 0.02


async def test_one_tick_wakes_every_waiter() -> None:
    ticker = FlushTicker(INTERVAL_S)
    waits = [ticker.next_tick() for _ in range(50)]
    assert all(w is not waits[0] for w in waits[1:])  # each its own future
    await waits[0]
    assert all(w.done() for w in waits)  # resolved by the same tick
    later = ticker.next_tick()  # a wait asked after the tick waits for the next one
    assert not later.done()
    await later


async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    ticker = FlushTicker(INTERVAL_S)
    mine, theirs = ticker.next_tick(), ticker.next_tick()

    async def wait(future: asyncio.Future[None]) -> None:
        await future

    task = asyncio.create_task(wait(mine))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(theirs, timeout=10)
    assert theirs.done() and not theirs.cancelled()


async def test_a_tick_never_comes_before_the_next_grid_point() -> None:
    ticker = FlushTicker(INTERVAL_S)
    loop = asyncio.get_running_loop()
    for _ in range(3):
        asked = loop.time()
        await ticker.next_tick()
        # A loaded host may run the tick late, never early (beyond the loop's millisecond).
        due = (math.floor(asked / INTERVAL_S) + 1) * INTERVAL_S
        assert loop.time() >= due - 0.002


def test_a_flush_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        FlushTicker(0.0)
