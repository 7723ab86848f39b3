"""The flush ticker: one tick on a fixed grid wakes every stream waiting for it, a waiter that is
cancelled cancels nobody else's wait, and no timer runs while nobody waits."""

from __future__ import annotations

import asyncio

import pytest

from gateway.coalesce import FlushTicker

INTERVAL_S = 0.02


async def test_one_tick_on_the_grid_wakes_every_waiter() -> None:
    ticker = FlushTicker(INTERVAL_S)
    loop = asyncio.get_running_loop()
    waits = [ticker.next_tick() for _ in range(50)]
    assert all(w is not waits[0] for w in waits[1:])  # each its own future
    await asyncio.gather(*waits)
    woke = loop.time()
    # The tick was on the grid: the next one is a whole interval on from it, at most.
    after = ticker.next_tick()
    await after
    assert loop.time() - woke <= INTERVAL_S + 0.5  # a loaded host only ever adds time
    assert loop.time() >= woke


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


async def test_ticks_follow_one_another_on_the_grid() -> None:
    ticker = FlushTicker(INTERVAL_S)
    loop = asyncio.get_running_loop()
    times = []
    for _ in range(3):
        await ticker.next_tick()
        times.append(loop.time())
    # Each tick is at or past a grid point (the loop may run its timers up to a millisecond
    # early or, loaded, late), so ticks never come closer than about an interval apart.
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(gap >= INTERVAL_S - 0.002 for gap in gaps)


def test_a_flush_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        FlushTicker(0.0)
