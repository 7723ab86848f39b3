"""Start simulated backends inside the current event loop: for tests, `kvgate demo` and benchmarks.

    async with running_sim(preset="llama-3-8b-h100", time_scale=100) as url:
        ...  # url == "http://127.0.0.1:<port>", serving /v1/..., /health, /metrics

The server binds port 0 (the OS picks a free port, so parallel runs never collide), runs with
handler cancellation on (a client disconnect aborts its request in the engine) and is shut down
cleanly on exit: open connections are closed and the driver task is cancelled and awaited.
`serving(app)` does the same for an app built with `server.create_app` (to reach its state), and
`serve` runs one simulator in the foreground until SIGINT or SIGTERM, for the CLI.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from loadtest.sim.presets import DEFAULT_PRESET
from loadtest.sim.server import SimSettings, create_app

# Open streams get this long to end when a simulator shuts down; then they are cut.
SHUTDOWN_TIMEOUT_S = 1.0


@asynccontextmanager
async def serving(app: web.Application, host: str = "127.0.0.1", port: int = 0
                  ) -> AsyncIterator[str]:
    """Serve an already built simulator app (see `server.create_app`); yields its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        if ":" in bound_host:
            bound_host = f"[{bound_host}]"
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def running_sim(settings: SimSettings | None = None, *, preset: str = DEFAULT_PRESET,
                      model: str | None = None, time_scale: float = 1.0,
                      metrics_format: str = "vllm", seed: int = 0,
                      num_gpu_blocks: int | None = None,
                      host: str = "127.0.0.1") -> AsyncIterator[str]:
    """A simulator on a free port of `host`, yielding its base URL (no trailing slash, no /v1).

    Pass either `settings` or the keyword fields (ignored when `settings` is given).
    ValueError for invalid settings, before anything is bound.
    """
    if settings is None:
        settings = SimSettings(preset=preset, model=model, time_scale=time_scale,
                               metrics_format=metrics_format, seed=seed,
                               num_gpu_blocks=num_gpu_blocks)
    async with serving(create_app(settings), host, 0) as url:
        yield url


async def serve(settings: SimSettings, host: str, port: int,
                on_ready: Callable[[str], None]) -> None:
    """Serve one simulator on host:port until SIGINT or SIGTERM; `on_ready(url)` once bound."""
    app = create_app(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with serving(app, host, port) as url:
            on_ready(url)
            await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
