"""Tracing: provider setup in one place, one span tree per request, W3C trace context in and out.

The tree for one request, built after the fact from its `RequestTiming` marks:

    "{operation} {model}"  (SERVER, arrival → end; parent: the client's traceparent, if any)
    ├── cache.lookup
    ├── queue.wait
    ├── route
    └── upstream           (CLIENT, dispatch → end; its context is what the backend receives)
        └── upstream.first_token   (dispatch → first content byte to the client)

No span is opened live. At arrival the root is sampled and its context fixed; the upstream
span's context is fixed when the proxy asks for headers (the backend must receive its
traceparent at dispatch). The whole tree is recorded in one go at the end with explicit
timestamps, as finished spans handed straight to the span processor (see `RequestTracer`), so
nothing touches tracing per chunk.

With tracing off, `Telemetry` hands out `NOOP_TRACE`, one shared object whose methods do nothing:
no span, no context, no allocation per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

import gateway.telemetry.labels as L
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
    """One request's trace while tracing is on: the root span's identity and sampling decision,
    fixed at arrival, and the upstream span's context, fixed when the proxy first asks for
    headers (retries share it). The spans themselves are recorded when the request finishes."""

    __slots__ = ("_clock", "_headers", "_ids", "_timing", "context", "offset", "parent",
                 "recording", "start_ns", "upstream", "upstream_start")  # fmt: skip

    def __init__(
        self,
        context: SpanContext,
        parent: SpanContext | None,
        recording: bool,
        timing: RequestTiming,
        offset: float,
        clock: Clock,
        ids: IdGenerator,
    ) -> None:
        self.context = context  # the root span's
        self.parent = parent  # the client's span, when it sent a valid traceparent
        self.recording = recording  # the sampler's decision for the whole tree
        self._timing = timing
        self.offset = offset
        self.start_ns = _ns(timing.arrival, offset)
        self._clock = clock
        self._ids = ids
        self.upstream: SpanContext | None = None
        self.upstream_start = 0  # epoch ns, once `upstream` is set
        self._headers: dict[str, str] | None = None

    @property
    def trace_id(self) -> str | None:
        return format(self.context.trace_id, "032x")

    def child_context(self) -> SpanContext:
        """A new span's context in this trace, sampled as the root is."""
        root = self.context
        return SpanContext(
            root.trace_id, self._ids.generate_span_id(), is_remote=False,
            trace_flags=root.trace_flags, trace_state=root.trace_state,
        )  # fmt: skip

    def open_upstream(self, start: float) -> SpanContext:
        self.upstream = upstream = self.child_context()
        self.upstream_start = _ns(start, self.offset)
        return upstream

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Injects the upstream span's context; the span itself is recorded at the end."""
        found = self._headers
        if found is None:
            upstream = self.upstream
            if upstream is None:
                start = self._timing.dispatch
                upstream = self.open_upstream(start if start is not None else self._clock())
            found = self._headers = {}
            _PROPAGATOR.inject(found, context=set_span_in_context(NonRecordingSpan(upstream)))
        headers.update(found)


def build_tracer_provider(
    settings: TelemetrySettings, span_processor: SpanProcessor | None = None
) -> tuple[TracerProvider, SpanProcessor] | None:
    """The one TracerProvider and its span processor, or None when tracing is off (no endpoint,
    nothing injected).

    It is never installed as the global provider: kvgate passes it where it is used.
    """
    if span_processor is None and settings.otlp_endpoint is None:
        return None
    ratio = settings.trace_sample_ratio
    root: Sampler = ALWAYS_ON if ratio >= 1.0 else TraceIdRatioBased(ratio)
    provider = TracerProvider(
        sampler=ParentBased(root),
        resource=Resource.create({"service.name": settings.service_name}),
        shutdown_on_exit=False,
    )
    if not isinstance(provider.get_tracer("kvgate"), Tracer):
        # OTEL_SDK_DISABLED: the SDK hands out no-op tracers; `RequestTracer` bypasses the
        # Tracer, so it honours that here by leaving tracing off.
        provider.shutdown()
        return None
    if span_processor is None:
        span_processor = BatchSpanProcessor(load_otlp_exporter(settings))
    provider.add_span_processor(span_processor)
    return provider, span_processor


_ROOT_NAME = "kvgate.request"  # what the sampler sees; the recorded name is "{operation} {model}"
_UNSET = Status(StatusCode.UNSET)


class RequestTracer:
    """Decides each request's sampling at arrival and records its span tree when it finishes.

    No span is opened live. At arrival the provider's sampler is asked, as `Tracer.start_span`
    would ask it for the root, and the root's context is fixed; at the end the whole tree is
    built in one pass as finished `ReadableSpan`s (children first, then the root) with explicit
    timestamps, the provider's resource and the "kvgate" scope, and handed to
    `processor.on_end`, which is where an SDK span goes when it ends. Children inherit the
    root's decision, as `ParentBased` gives them. This skips the SDK's per-span sampling,
    attribute validation and locking (kvgate's attributes are plain str/int/float/bool); the
    processors kvgate installs (batch, or the one passed in) do nothing in `on_start`, which
    these spans never go through.
    """

    def __init__(
        self, provider: TracerProvider, processor: SpanProcessor, clock: Clock, wall_clock: Clock
    ) -> None:
        self._provider = provider
        self._processor = processor
        self._sampler = provider.sampler
        self._ids = provider.id_generator
        self._resource = provider.resource
        self._scope = InstrumentationScope("kvgate")
        self._clock = clock
        self._wall_clock = wall_clock

    def start(self, timing: RequestTiming, headers: Mapping[str, str] | None) -> SpanTrace:
        """The root's context and sampling; a child of the client's `traceparent` when valid."""
        context = _PROPAGATOR.extract(headers) if headers is not None else _NO_PARENT
        parent: SpanContext | None = get_current_span(context).get_span_context()
        ids = self._ids
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            random_id = parent.trace_flags.random_trace_id
        else:
            parent = None
            trace_id = ids.generate_trace_id()
            random_id = ids.is_trace_id_random()
        sampling = self._sampler.should_sample(context, trace_id, _ROOT_NAME, SpanKind.SERVER)
        decision = sampling.decision
        flags = TraceFlags.SAMPLED if decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        root = SpanContext(
            trace_id, ids.generate_span_id(), is_remote=False, trace_flags=TraceFlags(flags),
            trace_state=sampling.trace_state,
        )  # fmt: skip
        offset = self._wall_clock() - self._clock()
        return SpanTrace(
            root, parent, decision is not Decision.DROP, timing, offset, self._clock, ids
        )

    def finish(self, trace: SpanTrace, timing: RequestTiming, outcome: RequestOutcome) -> None:
        if not trace.recording:
            return
        end = timing.end if timing.end is not None else self._clock()
        end_ns = _ns(end, trace.offset)
        error = _is_error(outcome)
        self._children(trace, timing, outcome, end_ns, error)
        self._emit(
            f"{outcome.operation} {outcome.request_model}", trace.context, trace.parent,
            trace.start_ns, end_ns, _root_attributes(timing, outcome), SpanKind.SERVER,
            Status(StatusCode.ERROR, outcome.error_label) if error else _UNSET,
        )  # fmt: skip

    def _children(
        self,
        trace: SpanTrace,
        timing: RequestTiming,
        outcome: RequestOutcome,
        end_ns: int,
        error: bool,
    ) -> None:
        offset = trace.offset
        root = trace.context
        emit = self._emit
        if timing.cache_start is not None and timing.cache_end is not None:
            emit("cache.lookup", trace.child_context(), root, _ns(timing.cache_start, offset),
                 _ns(timing.cache_end, offset), {L.CACHE_RESULT: outcome.cache})  # fmt: skip
        if timing.queue_start is not None and timing.queue_end is not None:
            queue: dict[str, AttributeValue] = {}
            if outcome.admission is not None:
                queue[L.ADMISSION_RESULT] = outcome.admission
            if outcome.rejection_reason is not None:
                queue[L.ADMISSION_REASON] = outcome.rejection_reason
            emit("queue.wait", trace.child_context(), root, _ns(timing.queue_start, offset),
                 _ns(timing.queue_end, offset), queue)  # fmt: skip
        if timing.route_start is not None and timing.route_end is not None:
            route: dict[str, AttributeValue] = {}
            if outcome.policy is not None:
                route[L.POLICY] = outcome.policy
            if outcome.backend is not None:
                route[L.BACKEND] = outcome.backend
            emit("route", trace.child_context(), root, _ns(timing.route_start, offset),
                 _ns(timing.route_end, offset), route)  # fmt: skip
        upstream = trace.upstream
        if upstream is None:
            if timing.dispatch is None:
                return
            upstream = trace.open_upstream(timing.dispatch)
        if timing.dispatch is not None and timing.first_byte is not None:
            emit("upstream.first_token", trace.child_context(), upstream,
                 _ns(timing.dispatch, offset), _ns(timing.first_byte, offset), {})  # fmt: skip
        attributes: dict[str, AttributeValue] = {}
        if outcome.backend is not None:
            attributes[L.BACKEND] = outcome.backend
        if outcome.response_model is not None:
            attributes[L.RESPONSE_MODEL] = outcome.response_model
        status = (
            Status(StatusCode.ERROR, outcome.error_label)
            if error and timing.first_byte is None
            else _UNSET
        )
        emit("upstream", upstream, root, trace.upstream_start, end_ns, attributes,
             SpanKind.CLIENT, status)  # fmt: skip

    def _emit(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, AttributeValue],
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status = _UNSET,
    ) -> None:
        self._processor.on_end(
            ReadableSpan(
                name=name,
                context=context,
                parent=parent,
                resource=self._resource,
                attributes=attributes,
                kind=kind,
                status=status,
                start_time=start_ns,
                end_time=end_ns,
                instrumentation_scope=self._scope,
            )
        )

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
