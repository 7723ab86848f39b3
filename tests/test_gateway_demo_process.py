"""A simulator in a process of its own (`kvgate demo`'s, loadtest/sim/process.py): it serves on
the port it reports, and its process is gone when the block ends, normally, by an error or by
cancellation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from loadtest.sim.process import sim_process


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.parametrize("ending", ["normally", "by an error", "by cancellation"])
async def test_a_simulator_process_serves_and_is_gone_after_its_block(ending: str) -> None:
    pid = 0
    started = asyncio.Event()

    async def run() -> None:
        nonlocal pid
        async with sim_process(time_scale=100.0) as sim:
            pid = sim.pid
            assert alive(pid)
            async with aiohttp.ClientSession() as http, http.get(f"{sim.url}/v1/models") as resp:
                assert resp.status == 200
                assert (await resp.json())["data"]
            started.set()
            if ending == "by an error":
                raise LookupError("the caller failed")
            if ending == "by cancellation":
                await asyncio.Event().wait()

    task = asyncio.ensure_future(run())
    await asyncio.wait_for(started.wait(), 60.0)
    if ending == "by cancellation":
        task.cancel()
    if ending == "normally":
        await task
    else:
        with pytest.raises(LookupError if ending == "by an error" else asyncio.CancelledError):
            await task
    assert pid and not alive(pid)


async def test_a_simulator_that_cannot_start_is_an_error_naming_why() -> None:
    with pytest.raises(RuntimeError, match="did not start: .*no-such-preset"):
        async with sim_process(preset="no-such-preset"):
            raise AssertionError("a simulator of an unknown preset started")
