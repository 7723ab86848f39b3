"""The gateway's listening socket, its client connections and its way out.

`serving(settings)` runs the app behind aiohttp's runner with the guarded protocol of
gateway/connections.py (head and body deadlines, the connection cap, OpenAI-shaped parse
errors) on a listener of its own, so that the drain decides when it stops accepting.

`Serving.drain(grace_s, shutdown_timeout_s)` is what SIGTERM runs (and, without the grace,
what leaving `serving` runs when no signal came first):

1. `/ready` answers 503 at once and new completions get 503 `shutting_down` with Retry-After
   (gateway/drain.py); the listener keeps accepting for `grace_s`, so load balancers see the 503
   before connections are refused;
2. the listener closes, idle connections close, busy ones close after their answer; requests
   still running get up to `shutdown_timeout_s` to finish;
3. any stream still running then ends with an SSE error event and `[DONE]`
   (`Relay.end_streams`), and the app is cleaned up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvloop
from aiohttp import web

from gateway import redact
from gateway.app import create_app
from gateway.config import Settings
from gateway.connections import ClientLimits, ConnectionBook, GuardedFactory
from gateway.drain import DRAIN, RELAY
from gateway.gc_policy import serving_gc
from gateway.keys import TELEMETRY
from gateway.logsink import configure_access_log
from gateway.telemetry.accesslog import LOGGER_NAME as ACCESS_LOGGER

log = logging.getLogger("kvgate.gateway")

BACKLOG = 1024
# What the runner's own shutdown waits for a handler once the drain has ended the rest: the
# drain's deadlines are the real ones.
CLEANUP_TIMEOUT_S = 0.25
SHUTDOWN_MESSAGE = "the gateway is shutting down; the stream was cut at its shutdown deadline"


@dataclass(slots=True)
class Serving:
    """A running gateway: its URL, app, runner and listener."""

    url: str
    app: web.Application
    runner: web.AppRunner
    listener: asyncio.AbstractServer
    factory: GuardedFactory
    drained: bool = False

    async def drain(self, grace_s: float, shutdown_timeout_s: float) -> None:
        """Steps 1 to 3 of the module's docstring; the app's cleanup is `serving`'s."""
        self.drained = True
        drain = self.app[DRAIN]
        drain.start()
        log.info("draining: /ready answers 503; accepting for %g s more", grace_s)
        if grace_s > 0:
            await asyncio.sleep(grace_s)
        self.listener.close()
        self.factory.close_idle()
        if drain.running:
            log.info("waiting up to %g s for %d running requests", shutdown_timeout_s,
                     drain.running)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(shutdown_timeout_s):
                    await drain.idle()
        relay = self.app.get(RELAY)
        if relay is not None:
            ended = await relay.end_streams(SHUTDOWN_MESSAGE)
            if ended:
                log.warning("ended %d streams still running at the shutdown deadline", ended)


@asynccontextmanager
async def serving(
    settings: Settings,
    *,
    reuse_port: bool = False,
    prepare: Callable[[web.Application], None] | None = None,
    **app_options: Any,
) -> AsyncIterator[Serving]:
    """The gateway serving on `settings.server` (port 0: a free port). `reuse_port`: listen with
    SO_REUSEPORT, beside the host's other workers on the same port (gateway/workers).
    `prepare(app)` runs before the app starts (a worker's shared state). `app_options` go to
    `create_app` (clock, rng, on_done)."""
    server = settings.server
    app = create_app(settings, **app_options)
    if prepare is not None:
        prepare(app)
    handler_options: dict[str, Any] = {
        "access_log": None,  # the proxy logs one line per request itself
        "keepalive_timeout": server.keepalive_timeout_s,
    }
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client disconnect cancels the handler: upstream closes
        shutdown_timeout=CLEANUP_TIMEOUT_S,
        **handler_options,
    )
    await runner.setup()
    try:
        assert runner.server is not None
        book = ConnectionBook()
        app[TELEMETRY].register_client_connections(book)
        limits = ClientLimits(header_timeout_s=server.client_header_timeout_s,
                              body_timeout_s=server.client_body_timeout_s,
                              max_connections=server.max_connections)
        factory = GuardedFactory(runner.server, limits, book, **handler_options)
        listener = await asyncio.get_running_loop().create_server(
            factory, server.host, server.port, backlog=BACKLOG, reuse_address=True,
            reuse_port=reuse_port or None)
        gateway = Serving(_url_of(listener), app, runner, listener, factory)
        try:
            yield gateway
        finally:
            if not gateway.drained:  # left without a signal: what runs still gets its time
                await gateway.drain(0.0, server.shutdown_timeout_s)
            listener.close()
    finally:
        await runner.cleanup()


def _url_of(listener: asyncio.AbstractServer) -> str:
    sock: socket.socket = listener.sockets[0]  # type: ignore[attr-defined]
    host, port = sock.getsockname()[:2]
    if sock.family == socket.AF_INET6:
        return f"http://[{host}]:{port}"
    return f"http://{host}:{port}"


async def serve_until_signalled(
    settings: Settings, on_ready: Callable[[str], None], **serving_options: Any
) -> None:
    """Serve until SIGTERM or SIGINT, then drain (gateway/lifecycle.py) and shut down: SIGTERM
    with the drain grace first, SIGINT (an operator's Ctrl-C) without it. `serving_options` go
    to `serving` (a worker's reuse_port and prepare)."""
    stopped: asyncio.Future[signal.Signals] = asyncio.get_running_loop().create_future()
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        if not stopped.done():
            stopped.set_result(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    server = settings.server
    try:
        async with serving(settings, **serving_options) as gateway:
            on_ready(gateway.url)
            with serving_gc():  # gateway/gc_policy.py: start-up's objects frozen
                sig = await stopped
                grace = server.drain_grace_s if sig == signal.SIGTERM else 0.0
                await gateway.drain(grace, server.shutdown_timeout_s)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run_on_uvloop(main: Callable[[], Any]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def configure_logging(level: str, secrets: Iterable[str] = ()) -> None:
    """Diagnostics to stderr; the JSON access log (one line per request) to stdout. Neither ever
    shows a secret (gateway/redact.py)."""
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    configure_access_log(level)
    redact.install(secrets, (logging.getLogger(), logging.getLogger(ACCESS_LOGGER)))
