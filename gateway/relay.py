"""One attempt on one backend: send the request, relay its answer, say what came of it.

- Anything that fails before the client saw a byte is a `Retry` (with its reason), so the proxy
  may try elsewhere: a connection failure (refused, reset, closed before any body byte), no first
  byte within the first-byte timeout (the attempt's connection is closed: the backend aborts),
  a 5xx or a 429. Once the first byte went out, a failure ends the stream with an SSE error
  event and `[DONE]`, never a silent truncation.
- A backend's error is relayed with its status and its `Retry-After` (a 503 without one gets
  `Retry-After: 1`), and nothing else of its headers; its body is normalised to OpenAI's shape,
  the backend's message kept.
- A stream is watched (gateway/stream_watch.py): a backend silent for the stream idle timeout is
  cut (an error event and `[DONE]` for the client, a `stream_idle` failure of the backend); a
  client whose writes block for the client write timeout is cut off as a client disconnect,
  never a fault of the backend.
- Leaving an attempt before its body was read to the end closes the upstream connection, so the
  backend aborts the request and frees its KV cache at once.
- Streams are relayed chunk by chunk as they arrive: bytes unchanged, written (and so flushed)
  immediately; `StreamObserver` picks out the few facts the gateway records. With a flush
  interval (gateway/coalesce.py), after the first content event a stream is read and written
  once per tick of that interval, its upstream's reading paused in between. A whole answer is
  decoded once, here, for everyone who reads it later. A stream that identical streams follow
  outlives its own client (gateway/carry.py).
- The backend's own API key, if it has one, goes as `Authorization: Bearer`; nothing of the
  client's headers is forwarded (its key least of all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from gateway.attempt import (
    CLIENT_CLOSED,
    RETRY_5XX,
    RETRY_429,
    RETRY_CONNECT,
    RETRY_RESET,
    RETRY_TIMEOUT,
    Relayed,
    Retry,
    UpstreamCall,
)
from gateway.carry import Carrier, LineTap
from gateway.coalesce import FlushTicker, pause_reading, resume_reading
from gateway.errors import (
    UpstreamTimeout,
    UpstreamUnreachable,
    normalise_error_body,
)
from gateway.exchange import Exchange
from gateway.headers import prepare_stream
from gateway.sse import DONE_EVENT, StreamObserver, error_event
from gateway.stream_watch import StreamIdle, StreamStopped, StreamWatch
from gateway.upstream_body import upstream_body
from routing.dispatch import Dispatch

__all__ = ["HealthView", "LineTap", "Relay", "Relayed", "Retry", "UpstreamCall",
           "retry_after_s"]

log = logging.getLogger("kvgate.gateway")


class HealthView(Protocol):
    """What an attempt tells routing.fleet.Fleet about its backend."""

    def record_request_success(self, backend_id: str, now: float) -> None: ...
    def record_request_failure(self, backend_id: str, now: float, reason: str) -> None: ...
    def record_unreachable(self, backend_id: str, now: float) -> None: ...
    def hold_off(self, backend_id: str, until: float) -> None: ...


class Relay:
    def __init__(self, *, session: aiohttp.ClientSession, fleet: HealthView,
                 first_byte_timeout: float, clock: Callable[[], float],
                 stream_idle_timeout: float = 60.0, client_write_timeout: float = 60.0,
                 flush_interval_s: float = 0.0) -> None:
        self._session = session
        self._fleet = fleet
        self._first_byte_timeout = first_byte_timeout
        self._idle_timeout = stream_idle_timeout
        self._write_timeout = client_write_timeout
        self._clock = clock
        self._ticker = FlushTicker(flush_interval_s) if flush_interval_s > 0 else None
        self._carrier = Carrier(idle_s=stream_idle_timeout, on_idle=self._idled)
        # The streams being relayed to their clients now, with their handlers' tasks.
        self._live: dict[StreamWatch, asyncio.Task[Any] | None] = {}

    @property
    def live_streams(self) -> frozenset[StreamWatch]:
        """The streams being relayed now; `stop` one to end it with an error event and
        `[DONE]`."""
        return frozenset(self._live)

    async def end_streams(self, message: str, *, wait_s: float = 2.0) -> int:
        """Ends every stream still being relayed (shutdown): each gets an SSE error event
        (`shutting_down`) and `[DONE]`, and its upstream is closed so the backend aborts. Waits
        up to `wait_s` for their handlers to finish. Returns how many there were."""
        live = list(self._live.items())
        for watch, _ in live:
            watch.stop(message, code="shutting_down")
        tasks = [task for _, task in live if task is not None and not task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=wait_s)
        return len(live)

    def carried(self, dispatch: Dispatch) -> asyncio.Task[None] | None:
        """The task reading `dispatch`'s stream on for its followers, if its client left while
        identical streams followed it: the backend still generates it until the task ends."""
        return self._carrier.carried(dispatch)

    async def attempt(self, request: web.Request, ex: Exchange, call: UpstreamCall,
                      dispatch: Dispatch, observer: StreamObserver | None) -> Relayed | Retry:
        backend_id = dispatch.backend_id
        spec = dispatch.decision.backend.spec
        url = spec.url + call.path
        headers = {"Content-Type": "application/json", "X-Request-Id": ex.request_id}
        if spec.api_key is not None:
            headers["Authorization"] = "Bearer " + spec.api_key
        timing = ex.timing
        if timing.dispatch is None:
            timing.dispatch = self._clock()
        ex.trace.inject(headers)  # after the dispatch mark: the upstream span starts there
        # One absolute deadline for the first byte: response headers plus the first body chunk.
        deadline = asyncio.get_running_loop().time() + self._first_byte_timeout
        try:
            async with asyncio.timeout_at(deadline):
                upstream = await self._session.post(url, data=upstream_body(call.body),
                                                     headers=headers)
        except aiohttp.ClientError as exc:
            return self._connection_failed(backend_id, exc)
        except TimeoutError:  # the cancelled request's connection is closed: the backend aborts
            return self._timed_out(backend_id)
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
            if not self._carrier.holds(upstream):
                if upstream.content.at_eof():
                    upstream.release()
                else:
                    upstream.close()

    def _connection_failed(self, backend_id: str, exc: BaseException) -> Retry:
        if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
            self._fleet.record_unreachable(backend_id, self._clock())  # refused, or no route
            reason = RETRY_CONNECT
        else:  # reset, or closed before answering
            self._fleet.record_request_failure(backend_id, self._clock(), "reset")
            reason = RETRY_RESET
        return Retry(UpstreamUnreachable(f"backend {backend_id} unreachable: {_describe(exc)}"),
                     reason)

    def _timed_out(self, backend_id: str) -> Retry:
        self._fleet.record_request_failure(backend_id, self._clock(), "timeout")
        return Retry(UpstreamTimeout(
            f"backend {backend_id} sent nothing within {self._first_byte_timeout:g} s"),
            RETRY_TIMEOUT)

    def _idled(self, backend_id: str) -> None:
        self._fleet.record_request_failure(backend_id, self._clock(), "stream_idle")

    async def _relay_body(self, call: UpstreamCall, backend_id: str,
                          upstream: aiohttp.ClientResponse, deadline: float) -> Relayed | Retry:
        """A whole (non-streamed) answer. A JSON body arrives at once when generation ends, so the
        first-byte deadline covers all of it."""
        try:
            async with asyncio.timeout_at(deadline):
                body = await upstream.read()
        except aiohttp.ClientError as exc:
            return self._connection_failed(backend_id, exc)
        except TimeoutError:
            return self._timed_out(backend_id)
        status = upstream.status
        headers = {
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
            "x-kvgate-backend": backend_id,
            "x-kvgate-model": call.model,
        }
        retry_after = upstream.headers.get("Retry-After")
        if status >= 400:
            body = normalise_error_body(body, status=status)
            headers["Content-Type"] = "application/json"
            if retry_after is not None:
                headers["Retry-After"] = retry_after
            elif status == 503:  # every 503 tells the client when to come back
                headers["Retry-After"] = "1"
        response = web.Response(status=status, body=body, headers=headers)
        now = self._clock()
        held = retry_after_s(retry_after) if status in (429, 503) else None
        if held is not None:  # the backend asked for a pause: no traffic, not a fault
            self._fleet.hold_off(backend_id, now + held)
        elif status >= 500:
            self._fleet.record_request_failure(backend_id, now, "status_5xx")
        else:
            self._fleet.record_request_success(backend_id, now)
        if status >= 500:
            return Retry(response, RETRY_5XX)
        if status == 429:
            return Retry(response, RETRY_429)
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
        except TimeoutError:
            return self._timed_out(backend_id)
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
        loop = asyncio.get_running_loop()
        time = loop.time
        watch = StreamWatch(loop, content, idle_s=self._idle_timeout,
                            write_s=self._write_timeout,
                            on_client_stuck=lambda: _cut_off(request, backend_id))
        self._live[watch] = asyncio.current_task()
        failure: str | None = None
        code = "upstream_stream_failed"
        tap = call.tap
        ticker = self._ticker
        # With coalescing, the upstream's transport, paused between ticks (None: never paused).
        connection = upstream.connection if ticker is not None else None
        socket = connection.transport if connection is not None else None
        try:
            watch.write_since = time()
            await prepare_stream(request, response, ex, self._clock(), dispatch.route_header())
            out = observer.feed(first)
            if out:
                await response.write(out)
                if tap is not None:
                    tap.stream_lines(out)
            watch.write_since = None
            watch.read_since = time()
            # The hot loop: read what arrived, note what matters, write it on at once (or, with
            # coalescing and the first token sent, wait for the tick, then read all that came).
            while True:
                if (ticker is not None and observer.first_token_at is not None
                        and not observer.done):
                    pause_reading(socket)
                    await ticker.next_tick()
                    resume_reading(socket)
                try:
                    chunk = await content.readany()
                except aiohttp.ClientError as exc:
                    failure = f"backend {backend_id} failed mid-stream: {_describe(exc)}"
                    self._fleet.record_request_failure(backend_id, self._clock(), "reset")
                    break
                except StreamIdle as exc:
                    failure = f"backend {backend_id} stalled mid-stream: {exc}"
                    code = "upstream_stream_idle"
                    self._idled(backend_id)
                    break
                except StreamStopped as exc:
                    failure, code = str(exc), exc.code
                    break
                if not chunk:
                    break
                out = observer.feed(chunk)
                if out:
                    watch.write_since = time()
                    await response.write(out)
                    watch.write_since = None
                    if tap is not None:
                        tap.stream_lines(out)
                watch.read_since = time()
            watch.write_since = time()
            if failure is None:
                tail = observer.finish()
                if tail:
                    await response.write(tail)
                    if tap is not None:
                        tap.stream_lines(tail)
                if not observer.complete:
                    failure = f"backend {backend_id} ended the stream before it finished"
            if failure is not None:
                await response.write(error_event(failure, code=code))
                await response.write(DONE_EVENT)
            elif not observer.done:
                await response.write(DONE_EVENT)
            await response.write_eof()
        except asyncio.CancelledError:
            # The client hung up (the handler is cancelled), or was cut off for reading nothing;
            # followers, if any, keep the stream.
            resume_reading(socket)
            self._carrier.carry_on(upstream, observer, tap, dispatch)
            raise
        except ConnectionResetError:
            # The client went away while we wrote; the caller closes the upstream connection
            # unless followers keep it.
            resume_reading(socket)
            self._carrier.carry_on(upstream, observer, tap, dispatch)
            gone = "client stopped reading" if watch.client_stuck else "client gone"
            return Relayed(response, CLIENT_CLOSED, gone, observer.usage,
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
            resume_reading(socket)  # a connection goes back to the pool reading
            watch.close()
            self._live.pop(watch, None)
        error = failure or (observer.error or {}).get("message")
        return Relayed(response, 200, error, observer.usage)


def _cut_off(request: web.Request, backend_id: str) -> None:
    """Aborts the connection of a client that reads nothing of its stream: its pending write
    and its handler end as a client disconnect."""
    log.info("a client read nothing of its stream from %s: cut off", backend_id)
    transport = request.transport
    if transport is not None:
        transport.abort()


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
