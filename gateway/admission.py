"""The asyncio side of admission: a `Gate` around the pure `routing.dispatch.Dispatcher`.

- `Gate.acquire(job)` submits a request. Dispatched at once, it returns the `Dispatch`; rejected,
  it raises `Overloaded` (429: the queue is full, or `OverSlo`: every backend is at its TPOT
  SLO) or `QueueTimeout`/`NoHealthyBackend` (503), each with Retry-After;
  queued, it waits on a Future that `pump` resolves. A client that hangs up while queued cancels
  the handler: its entry leaves the queue without dispatch (or, if it was dispatched in the same
  instant, the dispatch is finished at once, so its lease never leaks).
- Capacity can free on a completion (`finish`, which pumps at once) or on a new scrape; the
  gate's background task (`running`) pumps while anything is queued, every `tick_s` (the poll
  interval, so a scrape is acted on within one interval) and at the next queue deadline, which
  answers timed-out requests on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Any

from aiohttp import web

from gateway.config import Settings
from gateway.errors import GatewayError, NoHealthyBackend
from gateway.routing_settings import dispatch_config
from routing.cost import CostModel, Tokenizer
from routing.dispatch import (
    OVER_SLO,
    QUEUE_TIMEOUT,
    TENANT_QUEUE_FULL,
    Completion,
    Dispatch,
    Dispatcher,
    Job,
    Rejection,
    Waiting,
)
from routing.fleet import Fleet
from routing.policy import Router


class Overloaded(GatewayError):
    """The gateway queue (or the tenant's share of it) is full: try again after Retry-After."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"


class TenantQueueFull(Overloaded):
    """The tenant's share of the gateway queue is full (other tenants may still queue)."""

    code = "tenant_queue_full"


class OverSlo(Overloaded):
    """Every backend that could take the request is at its TPOT SLO (SLO admission): one more
    request would slow every reply there past it."""

    code = "over_slo"


class QueueTimeout(GatewayError):
    """The request waited in the gateway queue longer than the queue timeout."""

    status = 503
    type = "service_unavailable"
    code = "queue_timeout"


def rejection_error(rejection: Rejection) -> GatewayError:
    """Our error for a Dispatcher rejection, carrying Retry-After."""
    kind: type[GatewayError]
    if rejection.code == TENANT_QUEUE_FULL:
        kind = TenantQueueFull
    elif rejection.code == OVER_SLO:
        kind = OverSlo
    elif rejection.status == 429:
        kind = Overloaded
    elif rejection.code == QUEUE_TIMEOUT:
        kind = QueueTimeout
    else:
        kind = NoHealthyBackend
    error = kind(rejection.message)
    headers = {"x-kvgate-queue-ms": f"{rejection.queue_wait_s * 1000.0:.1f}"}
    if rejection.retry_after_s is not None:
        headers["Retry-After"] = str(rejection.retry_after_s)
    error.headers = MappingProxyType(headers)
    return error


class Gate:
    """One per app: the Dispatcher plus a Future per queued request."""

    def __init__(self, dispatcher: Dispatcher, clock: Callable[[], float], *,
                 tick_s: float) -> None:
        if tick_s <= 0:
            raise ValueError("tick_s must be positive")
        self.dispatcher = dispatcher
        self._clock = clock
        self._tick = tick_s
        self._waiters: dict[Waiting, asyncio.Future[Dispatch | Rejection]] = {}
        self._queued = asyncio.Event()  # set while anything may be queued

    async def acquire(self, job: Job) -> Dispatch:
        """A placed request (its lease held): the caller must `finish` it on every path."""
        out = self.dispatcher.submit(job, self._clock())
        if isinstance(out, Dispatch):
            return out
        if isinstance(out, Rejection):
            raise rejection_error(out)
        future: asyncio.Future[Dispatch | Rejection] = asyncio.get_running_loop().create_future()
        self._waiters[out] = future
        self._queued.set()
        try:
            result = await future
        except asyncio.CancelledError:
            self._waiters.pop(out, None)
            if not self.dispatcher.cancel(out, self._clock()):
                # Resolved in the same instant the client left: hand the slot straight back.
                if future.done() and not future.cancelled():
                    placed = future.result()
                    if isinstance(placed, Dispatch):
                        self.finish(placed)
            raise
        if isinstance(result, Rejection):
            raise rejection_error(result)
        return result

    def finish(self, dispatch: Dispatch, completion: Completion | None = None) -> None:
        """The attempt is over (once; later calls do nothing): release, learn, then pump."""
        if dispatch.finished:
            return
        self.dispatcher.finish(dispatch, self._clock(), completion)
        self.pump()

    def first_token(self, dispatch: Dispatch, at: float) -> None:
        """The attempt's first token arrived at `at` (this gate's clock): it calibrates the
        backend's speed long before the reply ends (`Dispatcher.first_token`)."""
        self.dispatcher.first_token(dispatch, at)

    def grow(self, dispatch: Dispatch, emitted: int) -> int | None:
        """A stream has emitted `emitted` tokens: grow its reservation if it outgrew it
        (`Dispatcher.grow`); returns the count at which to call again."""
        return self.dispatcher.grow(dispatch, emitted, self._clock())

    def reroute(self, dispatch: Dispatch) -> Dispatch | None:
        """Finish a failed attempt and place the request on a backend not tried yet, if any."""
        placed = self.dispatcher.reroute(dispatch, self._clock())
        self.pump()
        return placed

    def pump(self) -> None:
        """Dispatch what now fits and answer what timed out."""
        if not self._waiters:
            return
        pumped = self.dispatcher.pump(self._clock())
        results: list[Dispatch | Rejection] = [*pumped.dispatched, *pumped.rejected]
        for result in results:
            assert result.waiting is not None
            future = self._waiters.pop(result.waiting, None)
            if future is not None and not future.done():
                future.set_result(result)
            elif isinstance(result, Dispatch):  # nobody waits for it any more
                self.dispatcher.finish(result, self._clock())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Gate]:
        """The pump task for the duration of the block (an aiohttp cleanup_ctx)."""
        task = asyncio.create_task(self._run(), name="kvgate-admission")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for future in self._waiters.values():  # shutting down: nobody will be served
                future.cancel()
            self._waiters.clear()

    async def _run(self) -> None:
        while True:
            if not self._waiters:
                self._queued.clear()
                await self._queued.wait()
                continue
            now = self._clock()
            deadline = self.dispatcher.next_deadline(now)
            delay = self._tick if deadline is None else min(self._tick, max(0.0, deadline - now))
            await asyncio.sleep(delay)
            self.pump()


# Exact tokenizers, when configured.


class _HfTokenizer:
    """A tokenizer.json through the optional `tokenizers` package."""

    def __init__(self, path: str) -> None:
        module: Any = importlib.import_module("tokenizers")
        self._tokenizer = module.Tokenizer.from_file(path)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def load_tokenizers(paths: Mapping[str, str]) -> dict[str, Tokenizer]:
    """One exact tokenizer per model from its tokenizer.json (config validated the paths)."""
    return {model: _HfTokenizer(path) for model, path in paths.items()}


def build_gate(settings: Settings, fleet: Fleet, router: Router,
               clock: Callable[[], float]) -> Gate:
    """The app's Gate from the routing, SLO and advanced settings (exact tokenizers loaded here,
    at start-up)."""
    routing = settings.routing
    config = dispatch_config(routing, settings.slo, settings.advanced)
    cost_model = CostModel(tokenizers=load_tokenizers(routing.tokenizers),
                           reservation_quantile=routing.reservation_quantile,
                           context_tokens=routing.context_tokens)
    dispatcher = Dispatcher(fleet, router, cost_model, config=config)
    return Gate(dispatcher, clock, tick_s=routing.poll_interval_s)


GATE = web.AppKey("gate", Gate)


async def gate_running(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the gate's pump task for the app's lifetime."""
    async with app[GATE].running():
        yield
