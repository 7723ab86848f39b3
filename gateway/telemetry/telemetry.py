"""`Telemetry`: the one object the gateway talks to for traces, metrics and the access log.

Built once in `create_app` from `TelemetrySettings` and kept under an AppKey. Per request the
gateway calls `request_started` at arrival, `trace.inject(headers)` when it dispatches upstream,
and `request_finished` once at the end; everything for the request is recorded in that last
call. Nothing here reads a clock on its own: `clock` is the monotonic clock the gateway's
`RequestTiming` marks come from, `wall_clock` (epoch seconds) only anchors spans and log lines.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor

from gateway.telemetry.accesslog import LOGGER_NAME, AccessLog
from gateway.telemetry.connections import ConnectionCounts, ConnectionInstruments
from gateway.telemetry.gauges import BackendGaugesSource, QueueDepthSource, StateGauges
from gateway.telemetry.health import HealthInstruments, HealthSource
from gateway.telemetry.labels import LabelGuard
from gateway.telemetry.metrics import RequestMetrics
from gateway.telemetry.outcome import RequestOutcome
from gateway.telemetry.prometheus import PrometheusReader
from gateway.telemetry.settings import TelemetrySettings
from gateway.telemetry.timing import RequestTiming
from gateway.telemetry.tracing import (
    NOOP_TRACE,
    RequestTrace,
    RequestTracer,
    SpanTrace,
    build_tracer_provider,
)


class Telemetry:
    def __init__(
        self,
        settings: TelemetrySettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        span_processor: SpanProcessor | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        """`span_processor` turns tracing on without OTLP (tests, benchmarks); `rng` draws the
        access-log samples; `logger` defaults to the "kvgate.access" logger.

        Raises TelemetryConfigError when an OTLP endpoint is set and the exporter is missing.
        """
        self.settings = settings = settings if settings is not None else TelemetrySettings()
        self._clock = clock
        tracing = build_tracer_provider(settings, span_processor)
        self._tracer = RequestTracer(*tracing, clock, wall_clock) if tracing else None
        self._reader = PrometheusReader()
        self._meter_provider = MeterProvider(
            metric_readers=[self._reader],
            resource=Resource.create({"service.name": settings.service_name}),
            # Exemplars would look up the current span on every record; we link by trace_id in
            # the access log instead.
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,
        )
        meter = self._meter_provider.get_meter("kvgate")
        self._metrics = RequestMetrics(
            meter, LabelGuard(settings.max_label_values), settings.cache_tiers
        )
        self._reader.add_histograms(self._metrics.histograms)
        self._gauges = StateGauges(meter)
        self._health = HealthInstruments(meter)
        self._connections = ConnectionInstruments(meter)
        self._access_log = AccessLog(
            logger if logger is not None else logging.getLogger(LOGGER_NAME),
            sample_rate=settings.access_log_sample_rate,
            rng=rng if rng is not None else random.Random(),
            include_prompt=settings.access_log_prompts,
            wall_clock=wall_clock,
        )
        self._closed = False

    @property
    def tracing_enabled(self) -> bool:
        return self._tracer is not None

    def request_started(
        self, timing: RequestTiming, headers: Mapping[str, str] | None = None
    ) -> RequestTrace:
        """Call at arrival with the client's headers (for an incoming `traceparent`).

        Returns the trace handle to inject upstream headers with and to pass back to
        `request_finished`; with tracing off it is the shared NOOP_TRACE.
        """
        if self._tracer is None:
            return NOOP_TRACE
        return self._tracer.start(timing, headers)

    def request_finished(
        self, timing: RequestTiming, outcome: RequestOutcome, trace: RequestTrace = NOOP_TRACE
    ) -> None:
        """Record everything about one finished request: metrics, spans, access-log line.

        Call it exactly once on every path (a `finally`), failures and disconnects included:
        an unfinished request leaves its root span open and is missing from every figure.
        """
        self._metrics.record(timing, outcome)
        if self._tracer is not None and isinstance(trace, SpanTrace):
            self._tracer.finish(trace, timing, outcome)
        self._access_log.log(timing, outcome, trace.trace_id)

    def loop_lagged(self, seconds: float) -> None:
        """Record how late the event loop ran its watch timer (gateway/loop_watch.py)."""
        self._metrics.loop_lagged(seconds)

    def poll_error(self, backend: str, error: str) -> None:
        """Count one failed scrape of `backend`; `error` is a short class, e.g. "timeout"."""
        self._metrics.poll_error(backend, error)

    def retried(self, reason: str) -> None:
        """Count one request tried again elsewhere after a failure before its first byte."""
        self._metrics.retried(reason)

    def retry_budget_exhausted(self) -> None:
        """Count one failure returned as it was: the retry budget was spent."""
        self._metrics.retry_budget_exhausted.add(())

    def small_model_scored(self, alias: str, verdict: str, score: float) -> None:
        """Record one small-model classifier score for routing alias `alias`."""
        self._metrics.small_model_scored(alias, verdict, score)

    def register_backend_gauges(self, source: BackendGaugesSource) -> None:
        """Per-backend gauges read `source()` at each scrape; a later call replaces it."""
        self._gauges.set_backend_source(source)

    def register_backend_health(self, source: HealthSource) -> None:
        """The ejection counters and health gauges read `source()` at each scrape; a later call
        replaces it."""
        self._health.set_source(source)

    def register_queue_depth(self, source: QueueDepthSource) -> None:
        """The queue-depth gauge reads `source()` at each scrape; a later call replaces it."""
        self._gauges.set_queue_depth_source(source)

    def register_client_connections(self, book: ConnectionCounts) -> None:
        """The client-connection instruments read `book` at each scrape."""
        self._connections.set_source(book)

    def render_prometheus(self) -> bytes:
        """Body for GET /metrics; serve it with `prometheus.CONTENT_TYPE`."""
        return self._reader.render()

    def shutdown(self) -> None:
        """Flush and stop exporters. Idempotent; call from the app's cleanup."""
        if self._closed:
            return
        self._closed = True
        if self._tracer is not None:
            self._tracer.shutdown()
        self._meter_provider.shutdown()
