"""The upstream proxy: admission, the attempts on backends, and what came of them.

`Proxy.forward(request, ex, call, job)` asks the gate for a backend, makes the attempts
(gateway/relay.py) and returns a `Forwarded`: the response or the error the client gets, and the
request's `Outcome` (gateway/attempt.py). It calls nobody back; when the client hangs up it
re-raises the cancellation as a `ClientGone` carrying the `Outcome`.

- An attempt that failed before the client saw a byte (connection failure or reset, no first
  byte within the first-byte timeout, a 5xx or a 429) is retried once on another backend, while
  the retry budget (routing/retry_budget.py) allows; otherwise the client gets that failure: a
  504 for a timeout, the backend's own answer for an error it sent. A backend's other answers are
  relayed, never retried, and nothing is retried once a byte reached the client. Retries and
  refusals of the budget are counted (`RetryMetrics`).
- Every attempt holds its gate dispatch (a Fleet lease) for exactly its lifetime, so the in-flight
  count is released on every path, client disconnect and cancellation included. A whole answer
  teaches the gate the backend's speed and the reply's length (`completion_of`); a stream's first
  token teaches it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from gateway.attempt import CLIENT_CLOSED, ClientGone, Forwarded, Outcome
from gateway.errors import GatewayError
from gateway.exchange import Exchange
from gateway.relay import Relay, Relayed, Retry, UpstreamCall
from gateway.sse import StreamObserver, finish_reason_of
from routing.dispatch import Completion, Dispatch, Job
from routing.retry_budget import RetryBudget

__all__ = ["ClientGone", "Forwarded", "Outcome", "Proxy", "UpstreamCall", "completion_of"]

MAX_ATTEMPTS = 2  # the first try and one retry on another backend


class Gate(Protocol):
    """Admission and routing (gateway/admission.py's Gate): a placed attempt holds its lease
    until `finish`; `reroute` finishes a failed one and places the request elsewhere."""

    async def acquire(self, job: Job) -> Dispatch: ...
    def finish(self, dispatch: Dispatch, completion: Completion | None = None) -> None: ...
    def first_token(self, dispatch: Dispatch, at: float) -> None: ...
    def grow(self, dispatch: Dispatch, emitted: int) -> int | None: ...
    def reroute(self, dispatch: Dispatch) -> Dispatch | None: ...


class RetryMetrics(Protocol):
    """Where retries are counted (gateway.telemetry.Telemetry)."""

    def retried(self, reason: str) -> None: ...
    def retry_budget_exhausted(self) -> None: ...


class _Uncounted:
    def retried(self, reason: str) -> None:
        del reason

    def retry_budget_exhausted(self) -> None:
        return None


class Proxy:
    def __init__(self, *, relay: Relay, gate: Gate, clock: Callable[[], float],
                 budget: RetryBudget | None = None, metrics: RetryMetrics | None = None) -> None:
        self._relay = relay
        self._gate = gate
        self._clock = clock
        self._budget = budget if budget is not None else RetryBudget()
        self._metrics: RetryMetrics = metrics if metrics is not None else _Uncounted()

    async def forward(self, request: web.Request, ex: Exchange, call: UpstreamCall,
                      job: Job) -> Forwarded:
        """The answer of the first backend that gives one. Admission refusing is a reply of
        429/503 with Retry-After; a failure of every attempt is 502 (unreachable), 504 (first-byte
        timeout) or the last backend's own error answer."""
        timing = ex.timing
        start = timing.queue_start = self._clock()
        try:
            dispatch = await self._gate.acquire(job)
        except asyncio.CancelledError:  # the client hung up while queued: never dispatched
            raise ClientGone(self._outcome(ex, call, job, None, CLIENT_CLOSED,
                                           error="client gone while queued",
                                           client_disconnected=True)) from None
        except GatewayError as exc:
            timing.queue_end = self._clock()  # refused: all of it was the admission's
            return Forwarded(exc, self._outcome(ex, call, job, None, exc.status,
                                                error=exc.message,
                                                rejection=exc.code or "rejected"))
        now = self._clock()
        # Disjoint parts of TTFT: the wait in the gateway queue, then the decision that placed
        # the request (its cost estimate and routing; all of acquire when it was not queued).
        timing.queue_end = timing.route_start = min(start + dispatch.queue_wait_s, now)
        timing.route_end = now
        budget = self._budget
        budget.started()
        retrying = False  # this request holds a share of the retry budget
        try:
            while True:
                result = await self._attempt(request, ex, call, job, dispatch)
                if retrying:
                    budget.retry_ended()
                    retrying = False
                if not isinstance(result, Retry):
                    return result
                if dispatch.attempt >= MAX_ATTEMPTS:
                    break
                if not budget.allows():
                    self._metrics.retry_budget_exhausted()
                    break
                retry = self._gate.reroute(dispatch)
                if retry is None:  # no other backend can take it
                    break
                budget.take()
                retrying = True
                self._metrics.retried(result.reason)
                dispatch = retry
        finally:
            if retrying:
                budget.retry_ended()
            budget.ended()
        failure = result.failure
        if isinstance(failure, web.Response):
            return Forwarded(failure, self._outcome(ex, call, job, dispatch, failure.status,
                                                    error=f"backend answered HTTP {failure.status}",
                                                    placed=False))
        return Forwarded(failure, self._outcome(ex, call, job, dispatch, failure.status,
                                                error=failure.message, placed=False))

    async def _attempt(self, request: web.Request, ex: Exchange, call: UpstreamCall, job: Job,
                       dispatch: Dispatch) -> Forwarded | Retry:
        """One try on the dispatched backend. The dispatch holds its ledger lease until this
        returns, on every path; a complete answer's usage and timing go back to the gate."""
        observer = StreamObserver(
            self._clock, lambda at: self._gate.first_token(dispatch, at),
            strip_usage=call.strip_usage, on_tokens=lambda n: self._gate.grow(dispatch, n),
        ) if call.stream else None
        completion: Completion | None = None
        try:
            try:
                result = await self._relay.attempt(request, ex, call, dispatch, observer)
            except asyncio.CancelledError:  # the client hung up (handler cancellation)
                raise ClientGone(self._outcome(ex, call, job, dispatch, CLIENT_CLOSED, observer,
                                               error="client gone",
                                               client_disconnected=True)) from None
            if isinstance(result, Retry):
                return result
            # Only a whole answer teaches: a cut stream's last gap is the failure, not a token.
            if result.status == 200 and (observer is None or observer.complete):
                completion = completion_of(
                    result.usage, dispatched_at=dispatch.dispatched_at,
                    first_token_at=observer.first_token_at if observer is not None else None,
                    ended_at=self._clock(),
                    text_events=observer.text_events if observer is not None else 0,
                    choices=call.choices, finish_reason=observer.finish_reason if observer
                    else finish_reason_of(result.answer))
            return Forwarded(result.response, self._relayed(ex, call, job, dispatch, result,
                                                            observer))
        finally:
            carried = self._relay.carried(dispatch)
            if carried is None:
                self._gate.finish(dispatch, completion)
            else:  # read on for its followers: the backend holds its KV until that ends
                carried.add_done_callback(lambda _: self._gate.finish(dispatch))

    def _relayed(self, ex: Exchange, call: UpstreamCall, job: Job, dispatch: Dispatch,
                 result: Relayed, observer: StreamObserver | None) -> Outcome:
        return self._outcome(ex, call, job, dispatch, result.status, observer, error=result.error,
                             usage=result.usage, answer=result.answer,
                             client_disconnected=result.client_disconnected)

    def _outcome(self, ex: Exchange, call: UpstreamCall, job: Job, dispatch: Dispatch | None,
                 status: int, observer: StreamObserver | None = None, *, error: str | None,
                 usage: Mapping[str, Any] | None = None, answer: dict[str, Any] | None = None,
                 client_disconnected: bool = False, rejection: str | None = None,
                 placed: bool = True) -> Outcome:
        """`placed` is False when every attempt failed before an answer: no backend took it."""
        timing = ex.timing
        first = observer.first_token_at if observer is not None else None
        if first is not None and timing.first_byte is None:
            timing.first_byte = first  # the chunk carrying it was written on at once
        if usage is None and observer is not None:
            usage = observer.usage
        decision = dispatch.decision if dispatch is not None and placed else None
        admission = "rejected" if rejection is not None else None
        if dispatch is not None:
            admission = "queued" if dispatch.waiting is not None else "admitted"
        return Outcome(
            request_id=ex.request_id,
            model=call.model,
            backend_id=decision.backend_id if decision else None,
            policy=decision.policy if decision else None,
            status=status,
            stream=call.stream,
            attempts=dispatch.attempt if dispatch is not None else 0,
            ttft_s=None if first is None else first - timing.arrival,
            duration_s=self._clock() - timing.arrival,
            finish_reason=observer.finish_reason if observer else None,
            usage=dict(usage) if usage is not None else None,
            error=error,
            tenant=job.tenant,
            client_disconnected=client_disconnected,
            admission=admission,
            rejection_reason=rejection,
            route=dispatch.route_header() if dispatch is not None else None,
            answer=answer,
        )


def completion_of(usage: Mapping[str, Any] | None, *, dispatched_at: float,
                  first_token_at: float | None, ended_at: float,
                  text_events: int = 0, choices: int = 1,
                  finish_reason: str | None = None) -> Completion:
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
                      duration_s=ended_at - dispatched_at, finish_reason=finish_reason)
