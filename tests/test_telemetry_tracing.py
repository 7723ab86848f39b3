"""Traces: one span tree per request, GenAI attributes, W3C context in and out, OTLP lazily."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry import (
    NOOP_TRACE,
    RequestOutcome,
    RequestTiming,
    Telemetry,
    TelemetryConfigError,
    TelemetrySettings,
)

CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"
HTTP_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
WALL_OFFSET = 1_700_000_000.0  # the fake wall clock is the fake monotonic clock plus this


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def telemetry(exporter: InMemorySpanExporter, clock: FakeClock) -> Iterator[Telemetry]:
    t = Telemetry(
        TelemetrySettings(access_log_sample_rate=0.0),
        clock=clock,
        wall_clock=lambda: clock.now + WALL_OFFSET,
        span_processor=SimpleSpanProcessor(exporter),
    )
    yield t
    t.shutdown()


def streamed_miss() -> RequestTiming:
    return RequestTiming(
        arrival=1000.0, cache_start=1000.001, cache_end=1000.002, queue_start=1000.002,
        queue_end=1000.250, route_start=1000.250, route_end=1000.251, dispatch=1000.252,
        first_byte=1000.400, end=1001.400,
    )  # fmt: skip


def outcome(**fields: object) -> RequestOutcome:
    base: dict[str, object] = dict(
        request_id="req-1", operation="chat", request_model="llama-3-8b", status=200,
        stream=True, response_model="llama-3-8b-instruct", backend="b0", policy="kv",
        cache="miss", input_tokens=21, output_tokens=7, admission="queued",
        prompt="tell me a secret",
    )  # fmt: skip
    base.update(fields)
    return RequestOutcome(**base)  # type: ignore[arg-type]


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), "span names repeat"
    return named


def ns(t: float) -> int:
    return int((t + WALL_OFFSET) * 1e9)


def run_request(
    telemetry: Telemetry,
    timing: RequestTiming,
    result: RequestOutcome,
    client_headers: dict[str, str] | None = None,
) -> dict[str, str]:
    trace = telemetry.request_started(timing, client_headers)
    upstream_headers: dict[str, str] = {}
    if timing.dispatch is not None:
        trace.inject(upstream_headers)
    telemetry.request_finished(timing, result, trace)
    return upstream_headers


def test_span_tree_has_the_named_children(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    run_request(telemetry, streamed_miss(), outcome())
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {
        "chat llama-3-8b", "cache.lookup", "queue.wait", "route", "upstream",
        "upstream.first_token",
    }  # fmt: skip
    root = spans["chat llama-3-8b"]
    assert root.parent is None and root.kind is SpanKind.SERVER
    root_id = root.context.span_id
    for child in ("cache.lookup", "queue.wait", "route", "upstream"):
        parent = spans[child].parent
        assert parent is not None and parent.span_id == root_id, child
    first_token_parent = spans["upstream.first_token"].parent
    assert first_token_parent is not None
    assert first_token_parent.span_id == spans["upstream"].context.span_id
    assert spans["upstream"].kind is SpanKind.CLIENT
    assert {span.context.trace_id for span in spans.values()} == {root.context.trace_id}


def test_spans_carry_the_timing_marks(telemetry: Telemetry, exporter: InMemorySpanExporter) -> None:
    timing = streamed_miss()
    run_request(telemetry, timing, outcome())
    spans = by_name(exporter.get_finished_spans())
    expected = {
        "chat llama-3-8b": (timing.arrival, timing.end),
        "cache.lookup": (timing.cache_start, timing.cache_end),
        "queue.wait": (timing.queue_start, timing.queue_end),
        "route": (timing.route_start, timing.route_end),
        "upstream": (timing.dispatch, timing.end),
        "upstream.first_token": (timing.dispatch, timing.first_byte),
    }
    for name, (start, end) in expected.items():
        assert start is not None and end is not None
        span = spans[name]
        assert span.start_time == pytest.approx(ns(start), abs=1000), name
        assert span.end_time == pytest.approx(ns(end), abs=1000), name


def test_root_span_has_genai_and_kvgate_attributes(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    run_request(telemetry, streamed_miss(), outcome())
    root = by_name(exporter.get_finished_spans())["chat llama-3-8b"]
    assert root.attributes is not None
    attributes = dict(root.attributes)
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "llama-3-8b",
        "gen_ai.response.model": "llama-3-8b-instruct",
        "gen_ai.usage.input_tokens": 21,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.request.stream": True,
        "http.response.status_code": 200,
        "kvgate.request_id": "req-1",
        "kvgate.backend": "b0",
        "kvgate.routing.policy": "kv",
        "kvgate.cache.result": "miss",
        "kvgate.admission.result": "queued",
        "kvgate.queue_ms": pytest.approx(248.0),
        "kvgate.ttft_ms": pytest.approx(400.0),
    }
    assert root.status.status_code is StatusCode.UNSET
    for span in exporter.get_finished_spans():
        assert "tell me a secret" not in str(span.to_json())


def test_client_trace_context_is_accepted_and_propagated_to_the_backend(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    sent = run_request(
        telemetry, streamed_miss(), outcome(), {"traceparent": CLIENT_TRACEPARENT,
                                                "tracestate": "vendor=abc"}
    )  # fmt: skip
    spans = by_name(exporter.get_finished_spans())
    root = spans["chat llama-3-8b"]
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE_ID
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN_ID
    upstream = spans["upstream"]
    assert sent["traceparent"] == (
        f"00-{CLIENT_TRACE_ID}-{format(upstream.context.span_id, '016x')}-01"
    )
    assert sent["tracestate"] == "vendor=abc"


def test_a_malformed_client_traceparent_starts_a_new_trace(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    sent = run_request(telemetry, streamed_miss(), outcome(), {"traceparent": "00-zz-yy-01"})
    root = by_name(exporter.get_finished_spans())["chat llama-3-8b"]
    assert root.parent is None
    assert sent["traceparent"].split("-")[1] == format(root.context.trace_id, "032x")


def test_an_unsampled_client_trace_records_nothing_but_still_propagates(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    unsampled = f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-00"
    sent = run_request(telemetry, streamed_miss(), outcome(), {"traceparent": unsampled})
    assert exporter.get_finished_spans() == ()
    version, trace_id, _, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE_ID, "00")


def test_cache_hit_has_no_route_or_upstream_span(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    timing = RequestTiming(arrival=1000.0, cache_start=1000.0, cache_end=1000.002,
                           first_byte=1000.003, end=1000.004)  # fmt: skip
    run_request(telemetry, timing, outcome(cache="exact", backend=None, policy=None,
                                           admission=None))  # fmt: skip
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"chat llama-3-8b", "cache.lookup"}
    assert spans["cache.lookup"].attributes == {"kvgate.cache.result": "exact"}


def test_upstream_span_is_recorded_even_without_injected_headers(
    telemetry: Telemetry, exporter: InMemorySpanExporter
) -> None:
    timing = streamed_miss()
    telemetry.request_finished(timing, outcome(), telemetry.request_started(timing))
    spans = by_name(exporter.get_finished_spans())
    assert spans["upstream"].start_time == pytest.approx(ns(1000.252), abs=1000)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        pytest.param({"status": 502, "error_type": "upstream_connect"}, StatusCode.ERROR,
                     id="5xx marks the root span as an error"),
        pytest.param({"status": 200, "error_type": "upstream_reset"}, StatusCode.ERROR,
                     id="a failure after streaming started is an error"),
        pytest.param({"status": 429, "admission": "rejected", "rejection_reason": "queue_full"},
                     StatusCode.UNSET, id="4xx is the client's, not the server span's error"),
    ],
)  # fmt: skip
def test_error_status(
    telemetry: Telemetry,
    exporter: InMemorySpanExporter,
    fields: dict[str, object],
    code: StatusCode,
) -> None:
    run_request(telemetry, streamed_miss(), outcome(**fields))
    root = by_name(exporter.get_finished_spans())["chat llama-3-8b"]
    assert root.status.status_code is code
    assert root.attributes is not None
    assert root.attributes["error.type"] == fields.get("error_type", str(fields["status"]))


def test_sample_ratio_zero_records_no_new_traces(exporter: InMemorySpanExporter) -> None:
    telemetry = Telemetry(
        TelemetrySettings(trace_sample_ratio=0.0, access_log_sample_rate=0.0),
        span_processor=SimpleSpanProcessor(exporter),
    )
    try:
        run_request(telemetry, streamed_miss(), outcome())
    finally:
        telemetry.shutdown()
    assert exporter.get_finished_spans() == ()


def test_tracing_off_hands_out_one_shared_noop_trace() -> None:
    telemetry = Telemetry(TelemetrySettings(access_log_sample_rate=0.0))
    try:
        assert not telemetry.tracing_enabled
        timing = streamed_miss()
        headers = {"traceparent": CLIENT_TRACEPARENT}
        trace = telemetry.request_started(timing, headers)
        assert trace is NOOP_TRACE and trace.trace_id is None
        upstream: dict[str, str] = {}
        trace.inject(upstream)
        assert upstream == {}
    finally:
        telemetry.shutdown()


def test_tracing_off_runs_no_tracing_code_per_request() -> None:
    """The no-op path: no span, context or propagator work for any request, and so no
    per-request allocation for tracing; only the metrics are recorded."""
    telemetry = Telemetry(TelemetrySettings(access_log_sample_rate=0.0))
    timing = streamed_miss()
    called: list[str] = []

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            called.append(f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}")

    try:
        sys.setprofile(profile)
        trace = telemetry.request_started(timing, {"traceparent": CLIENT_TRACEPARENT})
        trace.inject({})
        sys.setprofile(None)
        at_start = called[:]
        called.clear()
        sys.setprofile(profile)
        telemetry.request_finished(timing, outcome(), trace)
    finally:
        sys.setprofile(None)
        telemetry.shutdown()
    assert at_start == [
        "gateway.telemetry.telemetry.Telemetry.request_started",
        "gateway.telemetry.tracing.NoopTrace.inject",
    ]
    tracing = ("opentelemetry.trace", "opentelemetry.propagators", "opentelemetry.sdk.trace",
               "gateway.telemetry.tracing")  # fmt: skip
    assert [name for name in called if name.startswith(tracing)] == [
        "gateway.telemetry.tracing.NoopTrace.trace_id"
    ]
    assert "gateway.telemetry.metrics.RequestMetrics.record" in called


class RecordingExporter(SpanExporter):
    """Stands in for OTLPSpanExporter in a fake module."""

    instances: list[RecordingExporter] = []

    def __init__(self, endpoint: str, headers: dict[str, str]) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.spans: list[ReadableSpan] = []
        self.shut_down = False
        RecordingExporter.instances.append(self)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True


@pytest.fixture
def fake_otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RecordingExporter]]:
    module = types.ModuleType(HTTP_EXPORTER_MODULE)
    module.OTLPSpanExporter = RecordingExporter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, HTTP_EXPORTER_MODULE, module)
    RecordingExporter.instances = []
    yield RecordingExporter.instances


def test_missing_otlp_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, HTTP_EXPORTER_MODULE, None)  # makes the import fail
    with pytest.raises(TelemetryConfigError, match=r"kvgate\[otlp\].*otlp-proto-http"):
        Telemetry(TelemetrySettings(otlp_endpoint="http://127.0.0.1:4318"))


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        pytest.param("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces",
                     id="a base URL gets the traces path"),
        pytest.param("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces",
                     id="a trailing slash too"),
        pytest.param("http://127.0.0.1:4318/custom/traces", "http://127.0.0.1:4318/custom/traces",
                     id="a full URL is kept"),
    ],
)  # fmt: skip
def test_otlp_exporter_is_built_lazily_with_the_endpoint(
    fake_otlp: list[RecordingExporter], endpoint: str, expected: str
) -> None:
    telemetry = Telemetry(
        TelemetrySettings(
            otlp_endpoint=endpoint, otlp_headers={"authorization": "Bearer t"},
            access_log_sample_rate=0.0,
        )
    )  # fmt: skip
    assert telemetry.tracing_enabled
    run_request(telemetry, streamed_miss(), outcome())
    telemetry.shutdown()
    (exporter,) = fake_otlp
    assert exporter.endpoint == expected
    assert exporter.headers == {"authorization": "Bearer t"}
    assert exporter.shut_down
    assert {span.name for span in exporter.spans} >= {"chat llama-3-8b", "upstream"}


def test_no_endpoint_means_no_exporter_is_imported(fake_otlp: list[RecordingExporter]) -> None:
    telemetry = Telemetry(TelemetrySettings())
    telemetry.shutdown()
    assert not telemetry.tracing_enabled and fake_otlp == []
