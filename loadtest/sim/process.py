"""Start a simulated backend in a process of its own: `kvgate sim` on a free loopback port.

    async with sim_process(preset="llama-3-8b-h100", seed=0) as sim:
        ...  # sim.url == "http://127.0.0.1:<port>", sim.pid its process

Unlike `running_sim` (loadtest/sim/launch.py), which serves inside the caller's event loop, the
simulator's steps then run on their own interpreter: a busy gateway (or another simulator) does
not stretch them, so what a client measures is the modelled GPU's speed, up to the contention
of the machine's cores the processes share. The port is the OS's choice (`--port 0`), read from
the line `kvgate sim` prints once it listens. The process is stopped by its PID on exit from
the block, whether it ends normally, by an error or by cancellation: SIGTERM, then SIGKILL if
it has not exited within `STOP_TIMEOUT_S`, and it is always waited for (no zombie is left).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from loadtest.sim.presets import DEFAULT_PRESET

START_TIMEOUT_S = 30.0  # an interpreter's start plus the simulator's imports, on a busy host
STOP_TIMEOUT_S = 5.0
_READY = re.compile(rb" on (http://\S+)\s*$")


@dataclass(frozen=True, slots=True)
class SimProcess:
    url: str  # base URL, no trailing slash, no /v1
    pid: int


@asynccontextmanager
async def sim_process(*, preset: str = DEFAULT_PRESET, time_scale: float = 1.0, seed: int = 0,
                      host: str = "127.0.0.1", metrics_format: str = "vllm",
                      num_gpu_blocks: int | None = None) -> AsyncIterator[SimProcess]:
    """`kvgate sim` in a child process, yielding its URL and PID once it listens. RuntimeError
    (with what it wrote to stderr) when it exits or stays silent past `START_TIMEOUT_S`."""
    args = [sys.executable, "-m", "gateway.cli", "sim", "--host", host, "--port", "0",
            "--preset", preset, "--time-scale", repr(time_scale), "--seed", str(seed),
            "--metrics-format", metrics_format]
    if num_gpu_blocks is not None:
        args += ["--num-gpu-blocks", str(num_gpu_blocks)]
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    drains: list[asyncio.Task[bytes]] = []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            url = await asyncio.wait_for(_ready_url(proc.stdout), START_TIMEOUT_S)
        except (TimeoutError, EOFError):
            await _stop(proc)
            err = (await proc.stderr.read()).decode(errors="replace").strip()
            raise RuntimeError(f"kvgate sim did not start: {err or 'no output'}") from None
        # Both pipes are read to their end from here on, so a chatty child never blocks on one.
        drains = [asyncio.ensure_future(proc.stdout.read()),
                  asyncio.ensure_future(proc.stderr.read())]
        yield SimProcess(url, proc.pid)
    finally:
        await _stop(proc)
        for task in drains:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _ready_url(stdout: asyncio.StreamReader) -> str:
    while True:
        line = await stdout.readline()
        if not line:
            raise EOFError
        match = _READY.search(line)
        if match:
            return match.group(1).decode()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM by PID, SIGKILL past the timeout; always reaped. Shielded, so that a cancelled
    caller still stops its child."""
    async def stop() -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    task = asyncio.ensure_future(stop())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
