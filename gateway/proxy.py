"""The upstream proxy: pick a backend, send the request, relay the answer.

Rules it keeps (DESIGN.md, issue 3):
- A connection failure (refused, reset, timeout while connecting, closed before any body byte) or a
  502/503 answer is retried once on another backend, but only while nothing has reached the client.
  Once the first byte went out, a failure ends the stream with an SSE error event and `[DONE]`,
  never a silent truncation.
- A backend's 4xx (and any other status) is relayed with its status; only the error body is
  normalised to OpenAI's shape. It is never retried.
- Every attempt holds a Fleet lease for exactly its lifetime, so the in-flight count is released on
  every path, client disconnect and cancellation included. Leaving an attempt before its body was
  read to the end closes the upstream connection, so the backend aborts the request and frees its
  KV cache at once.
- Streams are relayed chunk by chunk as they arrive: bytes unchanged, written (and so flushed)
  immediately; `StreamObserver` picks out the few facts the gateway records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from gateway.admission import ROUTED, Routed, body_usage, completion_of
from gateway.errors import (
    GatewayError,
    UpstreamTimeout,
    UpstreamUnreachable,
    normalise_error_body,
)
from gateway.sse import DONE_EVENT, StreamObserver, error_event
from gateway.telemetry import NOOP_TRACE, RequestTiming, RequestTrace
from routing.dispatch import Completion, Dispatch, Job
from routing.policy import Decision
from routing.state import Candidate

MAX_ATTEMPTS = 2  # the first try and one retry on another backend
RETRY_STATUSES = frozenset({502, 503})
CLIENT_CLOSED = 499  # the status an Outcome records when the client hung up (nginx's convention)

log = logging.getLogger("kvgate.access")


class FleetView(Protocol):
    """What the proxy needs from routing.fleet.Fleet."""

    def candidates(self, model: str | None, now: float) -> list[Candidate]: ...
    def lease(self, backend_id: str, blocks: int, now: float) -> AbstractContextManager[Any]: ...
    def record_failure(self, backend_id: str, now: float) -> None: ...
    def record_success(self, backend_id: str, now: float) -> None: ...


class AnswerTap(Protocol):
    """Sees a successful answer as it is relayed (the cache's store side, gateway/cache)."""

    def stream_lines(self, lines: bytes) -> None: ...  # complete SSE lines, as the client gets them
    def stream_ended(self, usage: dict[str, Any] | None) -> None: ...  # ended whole, no failure
    def whole(self, body: bytes) -> None: ...  # a 200 JSON answer


class Gate(Protocol):
    """Admission and routing (gateway/admission.py's Gate): a placed attempt holds its lease
    until `finish`; `reroute` finishes a failed one and places the request elsewhere."""

    async def acquire(self, job: Job) -> Dispatch: ...
    def finish(self, dispatch: Dispatch, completion: Completion | None = None) -> None: ...
    def first_token(self, dispatch: Dispatch, at: float) -> None: ...
    def reroute(self, dispatch: Dispatch) -> Dispatch | None: ...


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """One client request, ready to send to any backend that serves `model`."""

    path: str  # "/v1/chat/completions" or "/v1/completions"
    body: bytes  # the client's bytes, or re-encoded (alias resolved, stream usage asked for)
    model: str  # the real model name (aliases resolved)
    stream: bool
    job: Job  # what admission and routing decide on
    request_id: str
    arrived_at: float  # clock() when the request reached the gateway
    # The request's timing record: the proxy marks route, dispatch, connected and first_byte
    # (each once: a retry stays inside the first attempt's figures). `trace` adds the W3C
    # trace headers to every upstream call.
    timing: RequestTiming
    trace: RequestTrace = NOOP_TRACE
    # The gateway added `stream_options.include_usage` the client did not ask for: the usage-only
    # event is dropped from the relayed stream (gateway/sse.py).
    strip_usage: bool = False
    choices: int = 1  # the body's `n`: usage and text events count every choice's tokens
    tap: AnswerTap | None = None  # a cache miss: the answer is stored once it ended whole
    routed: Routed = field(default_factory=Routed)  # the proxy's record of admission and route


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one proxied request; handed to the `on_done` callback once."""

    request_id: str
    model: str
    backend_id: str | None
    policy: str | None
    reason: str | None
    status: int
    stream: bool
    attempts: int
    ttft_s: float | None  # arrival to the first text token (streams only)
    duration_s: float
    finish_reason: str | None
    usage: dict[str, Any] | None
    error: str | None  # what went wrong, if anything
    client_disconnected: bool = False
    timing: RequestTiming | None = None  # the call's timing record, the same object
    queue_s: float = 0.0  # waited in the gateway queue
    admission: str | None = None  # "admitted" | "queued" | "rejected"; None = not reached
    rejection_reason: str | None = None  # the Dispatcher's code, e.g. "queue_full"
    tenant: str | None = None
    route: str | None = None  # the x-kvgate-route value


@dataclass(frozen=True, slots=True)
class _Retry:
    """An attempt failed before the client saw a byte; retry elsewhere or report `failure`."""

    failure: GatewayError | web.Response


def log_outcome(outcome: Outcome) -> None:
    """The default `on_done`: one access-log line per request."""
    log.info(
        "%s %s backend=%s status=%d stream=%s attempts=%d ttft=%s dur=%.3f finish=%s error=%s%s",
        outcome.request_id,
        outcome.model,
        outcome.backend_id,
        outcome.status,
        outcome.stream,
        outcome.attempts,
        "-" if outcome.ttft_s is None else f"{outcome.ttft_s:.3f}",
        outcome.duration_s,
        outcome.finish_reason,
        outcome.error,
        " client-disconnected" if outcome.client_disconnected else "",
    )


class Proxy:
    def __init__(
        self,
        *,
        session: aiohttp.ClientSession,
        fleet: FleetView,
        gate: Gate,
        first_byte_timeout: float,
        clock: Callable[[], float],
        on_done: Callable[[Outcome], None] = log_outcome,
    ) -> None:
        self._session = session
        self._fleet = fleet
        self._gate = gate
        self._first_byte_timeout = first_byte_timeout
        self._clock = clock
        self._on_done = on_done

    async def forward(self, request: web.Request, call: UpstreamCall) -> web.StreamResponse:
        """The response for `call`, from the first backend that answers; raises GatewayError
        (429/503 with Retry-After when admission refuses, 502/503/504 for backend failures)."""
        timing, routed = call.timing, call.routed
        request[ROUTED] = routed
        start = timing.queue_start = self._clock()
        try:
            dispatch = await self._gate.acquire(call.job)
        except GatewayError as exc:
            timing.queue_end = self._clock()  # refused: all of it was the admission's
            routed.rejection = exc.code or "rejected"
            self._finish(call, None, exc.status, 0, error=exc.message)
            raise
        except asyncio.CancelledError:  # the client hung up while queued: never dispatched
            self._finish(call, None, CLIENT_CLOSED, 0, None, "client gone while queued", True)
            raise
        now = self._clock()
        # Disjoint parts of TTFT: the wait in the gateway queue, then the decision that placed
        # the request (its cost estimate and routing; all of acquire when it was not queued).
        timing.queue_end = timing.route_start = min(start + dispatch.queue_wait_s, now)
        timing.route_end = now
        failure: GatewayError | web.Response
        while True:
            routed.dispatch = dispatch
            result = await self._attempt(request, call, dispatch)
            if not isinstance(result, _Retry):
                return result
            failure = result.failure
            retry = self._gate.reroute(dispatch) if dispatch.attempt < MAX_ATTEMPTS else None
            if retry is None:
                break
            dispatch = retry
        if isinstance(failure, web.Response):
            self._finish(call, None, failure.status, dispatch.attempt, error="retryable status")
            return failure
        self._finish(call, None, failure.status, dispatch.attempt, error=failure.message)
        raise failure

    async def _attempt(
        self, request: web.Request, call: UpstreamCall, dispatch: Dispatch
    ) -> web.StreamResponse | _Retry:
        """One try on the dispatched backend. The dispatch holds its ledger lease until this
        returns, on every path; a complete answer's usage and timing go back to the Dispatcher."""
        observer = StreamObserver(
            self._clock, lambda at: self._gate.first_token(dispatch, at),
            strip_usage=call.strip_usage,
        ) if call.stream else None
        decision, attempt = dispatch.decision, dispatch.attempt
        completion: Completion | None = None
        try:
            result = await self._exchange(request, call, decision, attempt, observer)
            # Only a whole answer teaches: a cut stream's last gap is the failure, not a token.
            if not isinstance(result, _Retry) and result.status == 200 and (
                    observer is None or observer.complete):
                usage = observer.usage if observer is not None else body_usage(
                    result.body if isinstance(result, web.Response) else None)
                completion = completion_of(
                    usage, dispatched_at=dispatch.dispatched_at,
                    first_token_at=observer.first_token_at if observer is not None else None,
                    ended_at=self._clock(),
                    text_events=observer.text_events if observer is not None else 0,
                    choices=call.choices)
            return result
        except asyncio.CancelledError:  # the client hung up (handler cancellation)
            self._finish(call, decision, CLIENT_CLOSED, attempt, observer, "client gone", True)
            raise
        except GatewayError as exc:
            self._finish(call, decision, exc.status, attempt, observer, exc.message)
            raise
        finally:
            self._gate.finish(dispatch, completion)

    async def _exchange(
        self,
        request: web.Request,
        call: UpstreamCall,
        decision: Decision,
        attempt: int,
        observer: StreamObserver | None,
    ) -> web.StreamResponse | _Retry:
        backend_id = decision.backend_id
        url = decision.backend.spec.url + call.path
        headers = {"Content-Type": "application/json", "X-Request-Id": call.request_id}
        timing = call.timing
        if timing.dispatch is None:
            timing.dispatch = self._clock()
        call.trace.inject(headers)  # after the dispatch mark: the upstream span starts there
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
                return await self._relay_stream(
                    request, call, decision, upstream, deadline, attempt, observer
                )
            return await self._relay_body(call, decision, upstream, deadline, attempt)
        finally:
            # Closing (not releasing) a connection whose body was not read to the end is what
            # makes the backend abort the request; after a complete body it goes to the pool.
            if upstream.content.at_eof():
                upstream.release()
            else:
                upstream.close()

    def _connection_failed(self, backend_id: str, exc: BaseException) -> _Retry:
        self._fleet.record_failure(backend_id, self._clock())
        return _Retry(UpstreamUnreachable(f"backend {backend_id} unreachable: {_describe(exc)}"))

    def _timed_out(self, backend_id: str) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"backend {backend_id} sent nothing within {self._first_byte_timeout:g} s"
        )

    async def _relay_body(
        self,
        call: UpstreamCall,
        decision: Decision,
        upstream: aiohttp.ClientResponse,
        deadline: float,
        attempt: int,
    ) -> web.Response | _Retry:
        """A whole (non-streamed) answer. A JSON body arrives at once when generation ends, so the
        first-byte deadline covers all of it."""
        backend_id = decision.backend_id
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
        if status in RETRY_STATUSES:
            self._fleet.record_failure(backend_id, self._clock())
            return _Retry(response)
        self._fleet.record_success(backend_id, self._clock())
        if status == 200 and call.tap is not None:
            call.tap.whole(body)
        self._finish(call, decision, status, attempt, None, None if status < 400 else "status")
        return response

    async def _relay_stream(
        self,
        request: web.Request,
        call: UpstreamCall,
        decision: Decision,
        upstream: aiohttp.ClientResponse,
        deadline: float,
        attempt: int,
        observer: StreamObserver,
    ) -> web.StreamResponse | _Retry:
        backend_id = decision.backend_id
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
        self._fleet.record_success(backend_id, self._clock())

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
        try:
            await response.prepare(request)
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
                    self._fleet.record_failure(backend_id, self._clock())
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
                elif tap is not None and observer.error is None:
                    tap.stream_ended(observer.usage)
            if failure is not None:
                await response.write(error_event(failure, code="upstream_stream_failed"))
                await response.write(DONE_EVENT)
            elif not observer.done:
                await response.write(DONE_EVENT)
            await response.write_eof()
        except ConnectionResetError:
            # The client went away while we wrote; the caller closes the upstream connection.
            self._finish(call, decision, CLIENT_CLOSED, attempt, observer, "client gone", True)
            return response
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
            self._finish(call, decision, 500, attempt, observer, failure)
            return response
        error = failure or (observer.error or {}).get("message")
        self._finish(call, decision, 200, attempt, observer, error)
        return response

    def _finish(
        self,
        call: UpstreamCall,
        decision: Decision | None,
        status: int,
        attempts: int,
        observer: StreamObserver | None = None,
        error: str | None = None,
        client_disconnected: bool = False,
    ) -> None:
        now = self._clock()
        first = observer.first_token_at if observer is not None else None
        if first is not None and call.timing.first_byte is None:
            call.timing.first_byte = first  # the chunk carrying it was written on at once
        self._on_done(
            Outcome(
                request_id=call.request_id,
                model=call.model,
                backend_id=decision.backend_id if decision else None,
                policy=decision.policy if decision else None,
                reason=decision.reason if decision else None,
                status=status,
                stream=call.stream,
                attempts=attempts,
                ttft_s=None if first is None else first - call.arrived_at,
                duration_s=now - call.arrived_at,
                finish_reason=observer.finish_reason if observer else None,
                usage=observer.usage if observer else None,
                error=error,
                client_disconnected=client_disconnected,
                timing=call.timing,
                queue_s=call.routed.queue_s,
                admission=call.routed.admission,
                rejection_reason=call.routed.rejection,
                tenant=call.job.tenant,
                route=call.routed.dispatch.route_header() if call.routed.dispatch else None,
            )
        )


def _is_event_stream(upstream: aiohttp.ClientResponse) -> bool:
    return upstream.headers.get("Content-Type", "").startswith("text/event-stream")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
