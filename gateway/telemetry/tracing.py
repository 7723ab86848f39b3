"""Tracing: provider setup in one place, one span tree per request, W3C trace context in and out.

The tree for one request, built mostly after the fact from its `RequestTiming` marks:

    "{operation} {model}"  (SERVER, arrival → end; parent: the client's traceparent, if any)
    ├── cache.lookup
    ├── queue.wait
    ├── route
    └── upstream           (CLIENT, dispatch → end; its context is what the backend receives)
        └── upstream.first_token   (dispatch → first content byte to the client)

Only the root (at arrival) and `upstream` (when the proxy asks for headers) are opened live: the
backend must receive the upstream span's traceparent at dispatch. The rest is recorded in one
go at the end with explicit timestamps, so nothing touches tracing per chunk.

With tracing off, `Telemetry` hands out `NOOP_TRACE`, one shared object whose methods do nothing:
no span, no context, no allocation per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gateway.telemetry import labels as L
from gateway.telemetry.otlp import load_otlp_exporter
from gateway.telemetry.outcome import RequestOutcome
from gateway.telemetry.settings import TelemetrySettings
from gateway.telemetry.timing import RequestTiming

Clock = Callable[[], float]

_PROPAGATOR = TraceContextTextMapPropagator()  # stateless
_NO_PARENT = Context()


class RequestTrace(Protocol):
    """What the proxy and the access log use of a request's trace."""

    @property
    def trace_id(self) -> str | None: ...

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add `traceparent` (and `tracestate`) for the upstream call to `headers`."""


class NoopTrace:
    """The trace of every request while tracing is off."""

    __slots__ = ()

    @property
    def trace_id(self) -> str | None:
        return None

    def inject(self, headers: MutableMapping[str, str]) -> None:
        return None


NOOP_TRACE = NoopTrace()


def _ns(t: float, offset: float) -> int:
    """A monotonic-clock mark as epoch nanoseconds, `offset` being wall − monotonic."""
    return int((t + offset) * 1e9)


class SpanTrace:
    """One request's live spans while tracing is on."""

    __slots__ = ("_clock", "_timing", "_tracer", "offset", "root", "upstream")

    def __init__(
        self, tracer: Tracer, root: Span, timing: RequestTiming, offset: float, clock: Clock
    ) -> None:
        self._tracer = tracer
        self._timing = timing
        self.offset = offset
        self._clock = clock
        self.root = root
        self.upstream: Span | None = None

    @property
    def trace_id(self) -> str | None:
        context = self.root.get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else None

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Opens the upstream span on first use (retries share it) and injects its context."""
        upstream = self.upstream
        if upstream is None:
            start = self._timing.dispatch
            upstream = self.upstream = self._tracer.start_span(
                "upstream",
                context=set_span_in_context(self.root),
                kind=SpanKind.CLIENT,
                start_time=_ns(start if start is not None else self._clock(), self.offset),
            )
        _PROPAGATOR.inject(headers, context=set_span_in_context(upstream))


def build_tracer_provider(
    settings: TelemetrySettings, span_processor: SpanProcessor | None = None
) -> TracerProvider | None:
    """The one TracerProvider, or None when tracing is off (no endpoint, nothing injected).

    It is never installed as the global provider: kvgate passes it where it is used.
    """
    if span_processor is None:
        if settings.otlp_endpoint is None:
            return None
        span_processor = BatchSpanProcessor(load_otlp_exporter(settings))
    ratio = settings.trace_sample_ratio
    root: Sampler = ALWAYS_ON if ratio >= 1.0 else TraceIdRatioBased(ratio)
    provider = TracerProvider(
        sampler=ParentBased(root),
        resource=Resource.create({"service.name": settings.service_name}),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(span_processor)
    return provider


class RequestTracer:
    """Opens each request's root span and records the rest of its tree when it finishes."""

    def __init__(self, provider: TracerProvider, clock: Clock, wall_clock: Clock) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("kvgate")
        self._clock = clock
        self._wall_clock = wall_clock

    def start(self, timing: RequestTiming, headers: Mapping[str, str] | None) -> SpanTrace:
        """Root span from the arrival mark, child of the client's `traceparent` when valid."""
        parent = _PROPAGATOR.extract(headers) if headers is not None else _NO_PARENT
        offset = self._wall_clock() - self._clock()
        root = self._tracer.start_span(
            "kvgate.request",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=_ns(timing.arrival, offset),
        )
        return SpanTrace(self._tracer, root, timing, offset, self._clock)

    def finish(self, trace: SpanTrace, timing: RequestTiming, outcome: RequestOutcome) -> None:
        offset = trace.offset
        end = timing.end if timing.end is not None else self._clock()
        root = trace.root
        recording = root.is_recording()
        error = _is_error(outcome)
        if recording:
            root.update_name(f"{outcome.operation} {outcome.request_model}")
            root.set_attributes(_root_attributes(timing, outcome))
            parent = set_span_in_context(root)
            self._child("cache.lookup", parent, timing.cache_start, timing.cache_end, offset,
                        {L.CACHE_RESULT: outcome.cache})  # fmt: skip
            queue: dict[str, AttributeValue] = {}
            if outcome.admission is not None:
                queue[L.ADMISSION_RESULT] = outcome.admission
            if outcome.rejection_reason is not None:
                queue[L.ADMISSION_REASON] = outcome.rejection_reason
            self._child("queue.wait", parent, timing.queue_start, timing.queue_end, offset, queue)
            route: dict[str, AttributeValue] = {}
            if outcome.policy is not None:
                route[L.POLICY] = outcome.policy
            if outcome.backend is not None:
                route[L.BACKEND] = outcome.backend
            self._child("route", parent, timing.route_start, timing.route_end, offset, route)
            if trace.upstream is None and timing.dispatch is not None:
                trace.upstream = self._tracer.start_span(
                    "upstream", context=parent, kind=SpanKind.CLIENT,
                    start_time=_ns(timing.dispatch, offset),
                )  # fmt: skip
        upstream = trace.upstream
        if upstream is not None:
            if upstream.is_recording():
                self._finish_upstream(upstream, timing, outcome, offset, error)
            upstream.end(end_time=_ns(end, offset))
        if error:
            root.set_status(Status(StatusCode.ERROR, outcome.error_label))
        root.end(end_time=_ns(end, offset))

    def _finish_upstream(
        self,
        upstream: Span,
        timing: RequestTiming,
        outcome: RequestOutcome,
        offset: float,
        error: bool,
    ) -> None:
        attributes: dict[str, AttributeValue] = {}
        if outcome.backend is not None:
            attributes[L.BACKEND] = outcome.backend
        if outcome.response_model is not None:
            attributes[L.RESPONSE_MODEL] = outcome.response_model
        upstream.set_attributes(attributes)
        start = timing.dispatch
        if start is not None:
            self._child("upstream.first_token", set_span_in_context(upstream), start,
                        timing.first_byte, offset, {})  # fmt: skip
        if error and timing.first_byte is None:
            upstream.set_status(Status(StatusCode.ERROR, outcome.error_label))

    def _child(
        self,
        name: str,
        parent: Context,
        start: float | None,
        end: float | None,
        offset: float,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        if start is None or end is None:
            return
        span = self._tracer.start_span(
            name, context=parent, attributes=attributes, start_time=_ns(start, offset)
        )
        span.end(end_time=_ns(end, offset))

    def shutdown(self) -> None:
        self._provider.shutdown()


def _is_error(outcome: RequestOutcome) -> bool:
    """Server-span rule: 5xx is ours; a failure after a 2xx went out (mid-stream) is too."""
    return outcome.status >= 500 or (outcome.error_type is not None and outcome.status < 400)


def _root_attributes(timing: RequestTiming, outcome: RequestOutcome) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        L.OPERATION: outcome.operation,
        L.REQUEST_MODEL: outcome.request_model,
        "gen_ai.request.stream": outcome.stream,
        "http.response.status_code": outcome.status,
        "kvgate.request_id": outcome.request_id,
        L.CACHE_RESULT: outcome.cache,
    }
    optional: tuple[tuple[str, AttributeValue | None], ...] = (
        (L.RESPONSE_MODEL, outcome.response_model),
        ("gen_ai.usage.input_tokens", outcome.input_tokens),
        ("gen_ai.usage.output_tokens", outcome.output_tokens),
        (L.BACKEND, outcome.backend),
        (L.POLICY, outcome.policy),
        ("kvgate.tenant", outcome.tenant),
        (L.ADMISSION_RESULT, outcome.admission),
        (L.ADMISSION_REASON, outcome.rejection_reason),
        (L.ERROR_TYPE, outcome.error_label),
        ("kvgate.queue_ms", _ms(timing.queue_s)),
        ("kvgate.ttft_ms", _ms(timing.ttft_s)),
    )
    for key, value in optional:
        if value is not None:
            attributes[key] = value
    return attributes


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)
