"""One attempt on one backend: send the request, relay its answer, say what came of it.

- A connection failure (refused, reset, timeout while connecting, closed before any body byte) or
  a 502/503 answer is a `Retry`: nothing reached the client, so the proxy may try elsewhere.
  Once the first byte went out, a failure ends the stream with an SSE error event and `[DONE]`,
  never a silent truncation.
- A backend's 4xx (and any other status) is relayed with its status; only the error body is
  normalised to OpenAI's shape.
- Leaving an attempt before its body was read to the end closes the upstream connection, so the
  backend aborts the request and frees its KV cache at once.
- Streams are relayed chunk by chunk as they arrive: bytes unchanged, written (and so flushed)
  immediately; `StreamObserver` picks out the few facts the gateway records. A whole answer is
  decoded once, here, for everyone who reads it later.
- A stream that identical streams follow (the cache's `LineTap.followed`) outlives its own
  client: when the client leaves, the upstream is handed to a task that reads on for the
  followers while any remains and closes it (the backend aborts) when the last one goes. The
  attempt's lease on its backend is held until then: the backend still holds its KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from gateway.attempt import CLIENT_CLOSED
from gateway.errors import (
    GatewayError,
    UpstreamTimeout,
    UpstreamUnreachable,
    normalise_error_body,
)
from gateway.exchange import Exchange
from gateway.headers import prepare_stream
from gateway.sse import DONE_EVENT, StreamObserver, error_event
from routing.dispatch import Dispatch

RETRY_STATUSES = frozenset({502, 503})

log = logging.getLogger("kvgate.gateway")


class HealthView(Protocol):
    """What an attempt tells routing.fleet.Fleet about its backend."""

    def record_request_success(self, backend_id: str, now: float) -> None: ...
    def record_request_failure(self, backend_id: str, now: float, reason: str) -> None: ...
    def record_unreachable(self, backend_id: str, now: float) -> None: ...
    def hold_off(self, backend_id: str, until: float) -> None: ...


class LineTap(Protocol):
    """Sees a stream's complete SSE lines as the client gets them (the cache's store side and
    the identical streams following this one, gateway/cache)."""

    def stream_lines(self, lines: bytes) -> None: ...

    def followed(self) -> bool:
        """Identical streams follow this one now."""
        ...

    def carry_on(self) -> None:
        """The client left; the upstream is read on for the followers."""
        ...

    def carried_end(self, usage: dict[str, Any] | None, *, whole: bool) -> None:
        """The upstream read on for the followers ended."""
        ...


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One client request, ready to send to any backend that serves `model`."""

    path: str  # "/v1/chat/completions" or "/v1/completions"
    body: bytes  # the client's bytes, or re-encoded (alias resolved, stream usage asked for)
    model: str  # the real model name
    stream: bool
    # The gateway added `stream_options.include_usage` the client did not ask for: the usage-only
    # event is dropped from the relayed stream (gateway/sse.py).
    strip_usage: bool = False
    choices: int = 1  # the body's `n`: usage and text events count every choice's tokens
    tap: LineTap | None = None


@dataclass(frozen=True, slots=True)
class Relayed:
    """An attempt that answered the client (with whatever status)."""

    response: web.StreamResponse
    status: int  # CLIENT_CLOSED when the client left mid-stream
    error: str | None = None
    usage: dict[str, Any] | None = None
    answer: dict[str, Any] | None = None  # a whole 200 JSON answer, decoded
    client_disconnected: bool = False


@dataclass(frozen=True, slots=True)
class Retry:
    """An attempt failed before the client saw a byte; retry elsewhere or report `failure`."""

    failure: GatewayError | web.Response


class Relay:
    def __init__(self, *, session: aiohttp.ClientSession, fleet: HealthView,
                 first_byte_timeout: float, clock: Callable[[], float]) -> None:
        self._session = session
        self._fleet = fleet
        self._first_byte_timeout = first_byte_timeout
        self._clock = clock
        # Upstreams read on for followers after their own client left, each by its task, and
        # the same tasks by the dispatch they belong to (whose lease they keep held).
        self._carried: dict[aiohttp.ClientResponse, asyncio.Task[None]] = {}
        self._carried_for: dict[Dispatch, asyncio.Task[None]] = {}
        # Streams being relayed to their clients now, with their handlers' tasks: what
        # `end_streams` ends at shutdown.
        self._live: dict[web.StreamResponse, asyncio.Task[Any] | None] = {}

    def carried(self, dispatch: Dispatch) -> asyncio.Task[None] | None:
        """The task reading `dispatch`'s stream on for its followers, if its client left while
        identical streams followed it: the backend still generates it until the task ends."""
        return self._carried_for.get(dispatch)

    async def attempt(self, request: web.Request, ex: Exchange, call: UpstreamCall,
                      dispatch: Dispatch, observer: StreamObserver | None) -> Relayed | Retry:
        """Raises UpstreamTimeout when the backend sends nothing within the first-byte timeout
        (never retried: the backend may still be working on it)."""
        backend_id = dispatch.backend_id
        url = dispatch.decision.backend.spec.url + call.path
        headers = {"Content-Type": "application/json", "X-Request-Id": ex.request_id}
        timing = ex.timing
        if timing.dispatch is None:
            timing.dispatch = self._clock()
        ex.trace.inject(headers)  # after the dispatch mark: the upstream span starts there
        # One absolute deadline for the first byte: response headers plus the first body chunk.
        deadline = asyncio.get_running_loop().time() + self._first_byte_timeout
        try:
            async with asyncio.timeout_at(deadline):
                upstream = await self._session.post(url, data=call.body, headers=headers)
        except aiohttp.ClientError as exc:
            return self._connection_failed(backend_id, exc)
        except TimeoutError as exc:
            raise self._timed_out(backend_id) from exc
        if call.stream and timing.connected is None:
            # A streaming backend answers its headers on accepting the request, before its queue
            # and prefill: dispatch → here is the `connect` part of TTFT. A JSON answer's headers
            # come with the whole body, so there the mark would mean nothing.
            timing.connected = self._clock()
        try:
            if observer is not None and upstream.status == 200 and _is_event_stream(upstream):
                return await self._relay_stream(request, ex, call, dispatch, upstream, deadline,
                                                observer)
            return await self._relay_body(call, backend_id, upstream, deadline)
        finally:
            # Closing (not releasing) a connection whose body was not read to the end is what
            # makes the backend abort the request; after a complete body it goes to the pool.
            # An upstream carried on for followers is its task's to close.
            if upstream not in self._carried:
                if upstream.content.at_eof():
                    upstream.release()
                else:
                    upstream.close()

    def _connection_failed(self, backend_id: str, exc: BaseException) -> Retry:
        if isinstance(exc, aiohttp.ClientConnectorError):  # refused, or no route to it
            self._fleet.record_unreachable(backend_id, self._clock())
        else:  # reset, or closed before answering
            self._fleet.record_request_failure(backend_id, self._clock(), "reset")
        return Retry(UpstreamUnreachable(f"backend {backend_id} unreachable: {_describe(exc)}"))

    def _timed_out(self, backend_id: str) -> UpstreamTimeout:
        self._fleet.record_request_failure(backend_id, self._clock(), "timeout")
        return UpstreamTimeout(
            f"backend {backend_id} sent nothing within {self._first_byte_timeout:g} s"
        )

    async def _relay_body(self, call: UpstreamCall, backend_id: str,
                          upstream: aiohttp.ClientResponse, deadline: float) -> Relayed | Retry:
        """A whole (non-streamed) answer. A JSON body arrives at once when generation ends, so the
        first-byte deadline covers all of it."""
        try:
            async with asyncio.timeout_at(deadline):
                body = await upstream.read()
        except aiohttp.ClientError as exc:
            return self._connection_failed(backend_id, exc)
        except TimeoutError as exc:
            raise self._timed_out(backend_id) from exc
        status = upstream.status
        if status >= 400:
            body = normalise_error_body(body, status=status)
        response = web.Response(
            status=status,
            body=body,
            headers={
                "Content-Type": upstream.headers.get("Content-Type", "application/json"),
                "x-kvgate-backend": backend_id,
                "x-kvgate-model": call.model,
            },
        )
        now = self._clock()
        held = retry_after_s(upstream.headers.get("Retry-After")) if status in (429, 503) else None
        if held is not None:  # the backend asked for a pause: no traffic, not a fault
            self._fleet.hold_off(backend_id, now + held)
        elif status >= 500:
            self._fleet.record_request_failure(backend_id, now, "status_5xx")
        else:
            self._fleet.record_request_success(backend_id, now)
        if status in RETRY_STATUSES:
            return Retry(response)
        if status != 200:
            return Relayed(response, status, error=None if status < 400 else "status")
        answer = _decoded(body) if call.tap is not None or b'"usage"' in body else None
        usage = answer.get("usage") if answer is not None else None
        return Relayed(response, status, usage=usage if isinstance(usage, dict) else None,
                       answer=answer)

    async def _relay_stream(self, request: web.Request, ex: Exchange, call: UpstreamCall,
                            dispatch: Dispatch, upstream: aiohttp.ClientResponse,
                            deadline: float, observer: StreamObserver) -> Relayed | Retry:
        backend_id = dispatch.backend_id
        content = upstream.content
        try:
            async with asyncio.timeout_at(deadline):
                first = await content.readany()
        except aiohttp.ClientError as exc:
            return self._connection_failed(backend_id, exc)
        except TimeoutError as exc:
            raise self._timed_out(backend_id) from exc
        if not first:
            return self._connection_failed(backend_id, ConnectionError("empty stream"))
        self._fleet.record_request_success(backend_id, self._clock())

        response = web.StreamResponse(
            headers={
                "Content-Type": upstream.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                "x-kvgate-backend": backend_id,
                "x-kvgate-model": call.model,
            }
        )
        failure: str | None = None
        tap = call.tap
        self._live[response] = asyncio.current_task()
        try:
            await prepare_stream(request, response, ex, self._clock(), dispatch.route_header())
            out = observer.feed(first)
            if out:
                await response.write(out)
                if tap is not None:
                    tap.stream_lines(out)
            # The hot loop: read what arrived, note what matters, write it on at once.
            while True:
                try:
                    chunk = await content.readany()
                except aiohttp.ClientError as exc:
                    failure = f"backend {backend_id} failed mid-stream: {_describe(exc)}"
                    self._fleet.record_request_failure(backend_id, self._clock(), "reset")
                    break
                if not chunk:
                    break
                out = observer.feed(chunk)
                if out:
                    await response.write(out)
                    if tap is not None:
                        tap.stream_lines(out)
            if failure is None:
                tail = observer.finish()
                if tail:
                    await response.write(tail)
                    if tap is not None:
                        tap.stream_lines(tail)
                if not observer.complete:
                    failure = f"backend {backend_id} ended the stream before it finished"
            if failure is not None:
                await response.write(error_event(failure, code="upstream_stream_failed"))
                await response.write(DONE_EVENT)
            elif not observer.done:
                await response.write(DONE_EVENT)
            await response.write_eof()
        except asyncio.CancelledError:
            # The client hung up (the handler is cancelled); followers, if any, keep the stream.
            self._carry_on(upstream, observer, tap, dispatch)
            raise
        except ConnectionResetError:
            # The client went away while we wrote; the caller closes the upstream connection
            # unless followers keep it.
            self._carry_on(upstream, observer, tap, dispatch)
            return Relayed(response, CLIENT_CLOSED, "client gone", observer.usage,
                           client_disconnected=True)
        except Exception as exc:
            # A fault of the gateway's own once the stream has started: the status line is gone,
            # so the stream ends with an error event (a second response would corrupt it).
            log.exception("internal error relaying a stream from %s", backend_id)
            failure = f"internal error: {type(exc).__name__}"
            with contextlib.suppress(Exception):
                await response.write(error_event(failure, type_="server_error",
                                                 code="internal_error"))
                await response.write(DONE_EVENT)
                await response.write_eof()
            return Relayed(response, 500, failure, observer.usage)
        finally:
            self._live.pop(response, None)
        error = failure or (observer.error or {}).get("message")
        return Relayed(response, 200, error, observer.usage)


    async def end_streams(self, message: str) -> int:
        """Ends every stream still being relayed: an SSE error event (`shutting_down`) and
        `[DONE]`, the response ended, its handler cancelled (so the upstream is closed and the
        backend aborts). Returns how many there were."""
        live = list(self._live.items())
        self._live.clear()
        for response, task in live:
            with contextlib.suppress(Exception):
                await response.write(error_event(message, type_="server_error",
                                                 code="shutting_down"))
                await response.write(DONE_EVENT)
                await response.write_eof()
            if task is not None:
                task.cancel()
        return len(live)

    def _carry_on(self, upstream: aiohttp.ClientResponse, observer: StreamObserver,
                  tap: LineTap | None, dispatch: Dispatch) -> None:
        """Hands the upstream to a task reading on for the followers, if there are any."""
        if tap is None or not tap.followed() or upstream.content.at_eof():
            return
        tap.carry_on()
        task = asyncio.get_running_loop().create_task(self._read_on(upstream, observer, tap))
        self._carried[upstream] = task
        self._carried_for[dispatch] = task
        task.add_done_callback(lambda _: self._carried.pop(upstream, None))
        task.add_done_callback(lambda _: self._carried_for.pop(dispatch, None))

    async def _read_on(self, upstream: aiohttp.ClientResponse, observer: StreamObserver,
                       tap: LineTap) -> None:
        """The stream's rest, for the followers only, while any remains."""
        whole = False
        try:
            while tap.followed():
                chunk = await upstream.content.readany()
                if not chunk:
                    tail = observer.finish()
                    if tail:
                        tap.stream_lines(tail)
                    whole = observer.complete and observer.error is None
                    break
                out = observer.feed(chunk)
                if out:
                    tap.stream_lines(out)
        except aiohttp.ClientError as exc:
            log.info("a stream read on for its followers failed: %s", _describe(exc))
        finally:
            if upstream.content.at_eof():
                upstream.release()
            else:
                upstream.close()  # the last follower left: the backend aborts
            tap.carried_end(observer.usage, whole=whole)


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds (delta-seconds form; an HTTP date or garbage is
    None), capped at an hour so a lying backend cannot park itself for a day."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return min(seconds, 3600.0)


def _decoded(body: bytes) -> dict[str, Any] | None:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None


def _is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.headers.get("Content-Type", "").startswith("text/event-stream")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
