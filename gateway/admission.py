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
- Who is asking: the tenant is the `x-kvgate-tenant` header, else a hash of the Authorization
  bearer token (never the token itself), else "anonymous"; the priority class is the priority
  header (an integer, higher first, default 0); the session is the body's `user` field or the
  configured session header. API keys with classes do not exist yet: these headers stand in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Any

import orjson
from aiohttp import web

from gateway.config import Settings
from gateway.errors import GatewayError, InvalidRequest, NoHealthyBackend
from gateway.routing_settings import dispatch_config
from routing.cost import CostModel, Tokenizer
from routing.dispatch import (
    DEFAULT_TENANT,
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
from routing.prefix import conversation_text

MAX_PRIORITY = 1_000_000  # |priority| beyond this is a client error, not a class


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


# Who is asking, from the request.


def tenant_of(headers: Mapping[str, str], tenant_header: str) -> str:
    given = headers.get(tenant_header, "").strip()
    if given:
        return given[:128]
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        return f"key-{digest[:16]}"
    return DEFAULT_TENANT


def priority_of(headers: Mapping[str, str], priority_header: str) -> int:
    raw = headers.get(priority_header)
    if raw is None or not raw.strip():
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        value = MAX_PRIORITY + 1
    if abs(value) > MAX_PRIORITY:
        raise InvalidRequest(f"header {priority_header}: must be an integer priority class, "
                             f"got {raw!r}", param=priority_header)
    return value


def prompt_of(body: Mapping[str, Any]) -> tuple[str, int | None]:
    """(canonical prompt text, exact prompt tokens when the client sent token ids). Chat: the
    conversation's roles and text (text parts of multi-part contents); completions: the prompt
    string(s)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        pairs: list[tuple[str, str]] = []
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content
                                  if isinstance(part, Mapping)
                                  and isinstance(part.get("text"), str))
            pairs.append((str(message.get("role", "")),
                          content if isinstance(content, str) else ""))
        return conversation_text(pairs), None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt), None
        if all(isinstance(t, int) for t in prompt):
            return "", len(prompt)
        return "", sum(len(p) for p in prompt if isinstance(p, list))
    return "", None


def job_of(request: web.Request, body: Mapping[str, Any], *, model: str, request_id: str,
           max_tokens: int | None, stream: bool, priority_header: str,
           session_header: str | None, tenant: str) -> Job:
    """The Job for a request of `tenant` (its API key's, gateway/auth.py, else `tenant_of`)."""
    headers = request.headers
    prompt, exact = prompt_of(body)
    session: str | None = None
    if session_header is not None:
        session = headers.get(session_header) or None
    user = body.get("user")
    if session is None and isinstance(user, str) and user:
        session = user
    salt = body.get("cache_salt")
    return Job(
        request_id=request_id, model=model, prompt=prompt, max_tokens=max_tokens,
        prompt_tokens=exact, priority=priority_of(headers, priority_header),
        tenant=tenant, session=session,
        cache_salt=salt if isinstance(salt, str) else None, stream=stream,
    )


def completion_of(usage: Mapping[str, Any] | None, *, dispatched_at: float,
                  first_token_at: float | None, ended_at: float,
                  text_events: int = 0, choices: int = 1) -> Completion:
    """What a finished request teaches the cost model and the backend's profile. A stream
    without usage (a backend that ignores `stream_options`) is timed over its `text_events`,
    one token each; the cost model learns output lengths only from usage. With `choices` (the
    body's `n`) above 1 the choices decode side by side, and usage and events count them all:
    each figure is per choice."""
    prompt = usage.get("prompt_tokens") if usage else None
    output = usage.get("completion_tokens") if usage else None
    prompt = prompt if isinstance(prompt, int) else None
    output = output // choices if isinstance(output, int) and choices >= 1 else None
    text_events = text_events // max(1, choices)
    ttft = None if first_token_at is None else first_token_at - dispatched_at
    tpot = None
    tokens = output if output is not None else text_events
    if first_token_at is not None and tokens > 1:
        tpot = (ended_at - first_token_at) / (tokens - 1)
    return Completion(prompt_tokens=prompt, completion_tokens=output, ttft_s=ttft, tpot_s=tpot,
                      duration_s=ended_at - dispatched_at)


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


class Routed:
    """What admission and routing decided for one call, filled in by the proxy: read back into
    the call's Outcome and into the routed response's headers (`stamp_route`)."""

    __slots__ = ("dispatch", "rejection")

    def __init__(self) -> None:
        self.dispatch: Dispatch | None = None  # the latest attempt
        self.rejection: str | None = None  # the Dispatcher's code when admission refused

    @property
    def admission(self) -> str | None:
        """"admitted" (at once), "queued" (after waiting), "rejected", or None (not reached)."""
        if self.rejection is not None:
            return "rejected"
        if self.dispatch is None:
            return None
        return "queued" if self.dispatch.waiting is not None else "admitted"

    @property
    def queue_s(self) -> float:
        return self.dispatch.queue_wait_s if self.dispatch is not None else 0.0


ROUTED = web.RequestKey("routed", Routed)


async def stamp_route(request: web.Request, response: web.StreamResponse) -> None:
    """x-kvgate-route (policy, predicted TTFT and its parts, why) on every routed response.
    x-kvgate-queue-ms is telemetry's (`gateway.observe.stamp_timing`): arrival → dispatch, as
    DESIGN.md defines queue time; the admission wait alone is server-timing's `queue` part."""
    routed = request.get(ROUTED)
    if routed is None or routed.dispatch is None:
        return
    response.headers["x-kvgate-route"] = routed.dispatch.route_header()


def body_usage(body: object) -> dict[str, Any] | None:
    """The `usage` object of a whole JSON answer, or None."""
    if not isinstance(body, bytes) or b'"usage"' not in body:
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return usage if isinstance(usage, dict) else None


def build_gate(settings: Settings, fleet: Fleet, router: Router,
               clock: Callable[[], float]) -> Gate:
    """The app's Gate from the routing, SLO and advanced settings (exact tokenizers loaded here,
    at start-up)."""
    routing = settings.routing
    config = dispatch_config(routing, settings.slo, settings.advanced)
    cost_model = CostModel(tokenizers=load_tokenizers(routing.tokenizers))
    dispatcher = Dispatcher(fleet, router, cost_model, config=config)
    return Gate(dispatcher, clock, tick_s=routing.poll_interval_s)


GATE = web.AppKey("gate", Gate)


async def gate_running(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: the gate's pump task for the app's lifetime."""
    async with app[GATE].running():
        yield
