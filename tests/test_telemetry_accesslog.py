"""The access log: one JSON line per sampled request on "kvgate.access", prompts only on demand."""

from __future__ import annotations

import logging
import random

import orjson
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry import RequestOutcome, RequestTiming, Telemetry, TelemetrySettings

SECRET = "my bank password is hunter2"


def timing() -> RequestTiming:
    return RequestTiming(
        arrival=10.0, queue_start=10.001, queue_end=10.0133, dispatch=10.014,
        first_byte=10.1, end=10.6,
    )  # fmt: skip


def outcome(request_id: str = "req-1") -> RequestOutcome:
    return RequestOutcome(
        request_id=request_id, operation="chat", request_model="auto", status=200, stream=True,
        response_model="llama-3-8b", backend="b1", policy="kv", cache="miss", input_tokens=21,
        output_tokens=11, tenant="team-a", admission="queued", prompt=SECRET,
    )  # fmt: skip


def log_requests(settings: TelemetrySettings, count: int, seed: int = 0, **kwargs: object) -> int:
    """Run `count` requests; return how many lines reached the logger's handlers."""
    lines = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("kvgate.access")
    handler = Capture(logging.INFO)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    telemetry = Telemetry(settings, rng=random.Random(seed), wall_clock=lambda: 1.7e9)
    try:
        for i in range(count):
            telemetry.request_finished(timing(), outcome(f"req-{i}"))
    finally:
        telemetry.shutdown()
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return len(lines)


def test_one_json_line_per_request_with_the_figures(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    telemetry = Telemetry(TelemetrySettings(), wall_clock=lambda: 1_700_000_000.1234)
    telemetry.request_finished(timing(), outcome())
    telemetry.shutdown()
    (record,) = caplog.records
    assert record.name == "kvgate.access" and record.levelno == logging.INFO
    line = orjson.loads(record.getMessage())
    assert line == {
        "ts": 1_700_000_000.123,
        "request_id": "req-1",
        "trace_id": None,
        "tenant": "team-a",
        "operation": "chat",
        "model": "auto",
        "served_model": "llama-3-8b",
        "backend": "b1",
        "policy": "kv",
        "cache": "miss",
        "status": 200,
        "error": None,
        "stream": True,
        "admission": "queued",
        "rejection_reason": None,
        "input_tokens": 21,
        "output_tokens": 11,
        "queue_ms": pytest.approx(12.3),
        "ttft_ms": pytest.approx(100.0),
        "tpot_ms": pytest.approx(50.0),
        "duration_ms": pytest.approx(600.0),
    }
    assert line["ttft_ms"] >= line["queue_ms"]


@pytest.mark.parametrize(
    ("allowed", "present"),
    [
        pytest.param(False, False, id="prompt text is never logged by default"),
        pytest.param(True, True, id="prompt text is logged when explicitly enabled"),
    ],
)
def test_prompt_text_only_when_enabled(
    caplog: pytest.LogCaptureFixture, allowed: bool, present: bool
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    telemetry = Telemetry(TelemetrySettings(access_log_prompts=allowed))
    telemetry.request_finished(timing(), outcome())
    telemetry.shutdown()
    (record,) = caplog.records
    assert (SECRET in record.getMessage()) is present
    assert (orjson.loads(record.getMessage()).get("prompt") == SECRET) is present


def test_trace_id_links_the_line_to_its_trace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(TelemetrySettings(), span_processor=SimpleSpanProcessor(exporter))
    request = timing()
    telemetry.request_finished(request, outcome(), telemetry.request_started(request))
    telemetry.shutdown()
    (record,) = caplog.records
    trace_ids = {format(span.context.trace_id, "032x") for span in exporter.get_finished_spans()}
    assert trace_ids == {orjson.loads(record.getMessage())["trace_id"]}


@pytest.mark.parametrize(
    ("rate", "count", "expected"),
    [
        pytest.param(0.0, 200, 0, id="rate 0 logs nothing"),
        pytest.param(1.0, 200, 200, id="rate 1 logs every request"),
    ],
)
def test_sampling_extremes(rate: float, count: int, expected: int) -> None:
    assert log_requests(TelemetrySettings(access_log_sample_rate=rate), count) == expected


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampling_draws_from_the_injected_random(seed: int) -> None:
    rate, count = 0.3, 500
    replay = random.Random(seed)
    expected = sum(replay.random() < rate for _ in range(count))
    assert log_requests(TelemetrySettings(access_log_sample_rate=rate), count, seed) == expected


def test_nothing_is_logged_when_the_logger_is_not_enabled_for_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kvgate.access")
    telemetry = Telemetry(TelemetrySettings())
    telemetry.request_finished(timing(), outcome())
    telemetry.shutdown()
    assert caplog.records == []
