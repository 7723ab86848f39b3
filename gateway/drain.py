"""Graceful drain: what the app does between SIGTERM and exit.

`Drain` is the app's one view of it. Once `start()` is called, `/ready` answers 503 (so load
balancers stop sending), and every new completion request is answered 503 `shutting_down` with
`Retry-After` and `Connection: close` (the client retries on another replica). Requests already
running are counted by `drain_middleware`; `idle()` resolves when none is left. The sequence and
its deadlines (grace, then shutdown timeout, then the streams still running are ended) are
gateway/lifecycle.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import MappingProxyType

from aiohttp import web

from gateway.errors import GatewayError
from gateway.relay import Relay

RETRY_AFTER_S = 1  # another replica can take it at once; a client's own backoff does the rest
COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ShuttingDown(GatewayError):
    """The gateway is draining before it exits: new completions go elsewhere."""

    status = 503
    type = "service_unavailable"
    code = "shutting_down"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = MappingProxyType({"Retry-After": str(RETRY_AFTER_S)})


class Drain:
    """Whether the gateway is draining, and how many requests are running."""

    def __init__(self) -> None:
        self.draining = False
        self.running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        self.draining = True

    def enter(self) -> None:
        self.running += 1
        self._idle.clear()

    def leave(self) -> None:
        self.running -= 1
        if self.running == 0:
            self._idle.set()

    async def idle(self) -> None:
        """Returns once no request is running."""
        await self._idle.wait()


DRAIN = web.AppKey("drain", Drain)
# The relay whose live streams the drain ends at the shutdown deadline (set with the proxy).
RELAY = web.AppKey("relay", Relay)


@web.middleware
async def drain_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Counts running requests; while draining, refuses new completions and closes each
    connection after its answer. Inside the error middleware: the 503 is an OpenAI body."""
    drain = request.app[DRAIN]
    if drain.draining and request.path in COMPLETION_PATHS:
        raise ShuttingDown("the gateway is shutting down; retry on another replica")
    drain.enter()
    try:
        response = await handler(request)
    finally:
        drain.leave()
    if drain.draining and not response.prepared:
        response.force_close()
    return response
