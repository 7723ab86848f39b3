"""CPU cost of the telemetry calls alone, per request: telemetry on vs off, side by side.

    .venv/bin/python -m loadtest.bench_telemetry [--requests 20000] [--repeat 3] [--no-record]

Each configuration gets a fresh `Telemetry` and the same pre-generated requests (a seeded mix of
streamed misses, cache hits, non-streamed and rejected requests over a few models and backends),
and runs exactly what the gateway will call per request: `request_started`, `trace.inject` when
the request is dispatched, `request_finished`. CPU is process CPU time (`time.process_time`), so
the batch span processor's export thread counts too; each timed run ends with a flush. Requests
and timings are built before the clock starts. The end-to-end comparison, a whole gateway with
telemetry on and off, is `loadtest/bench_gateway_telemetry.py`. The table goes to
`loadtest/results/bench_telemetry.json` (`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from gateway.telemetry import BackendGauges, RequestOutcome, RequestTiming, Telemetry
from gateway.telemetry.settings import TelemetrySettings
from loadtest.results import Table, add_arguments, command, save

MODELS = ("llama-3-8b", "llama-3-70b", "qwen2-7b")
BACKENDS = ("b0", "b1", "b2", "b3")


class DiscardExporter(SpanExporter):
    """Exports nowhere: measures span building and batching, not the network."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


@dataclass(frozen=True)
class Config:
    name: str
    trace_ratio: float | None  # None = tracing off
    log_rate: float
    client_traceparent: bool  # a sampled client traceparent decides sampling, not the ratio


CONFIGS = (
    Config("off: metrics only (no tracing, no access log)", None, 0.0, True),
    Config("metrics + access log 100%, tracing off", None, 1.0, True),
    Config("on: metrics + traces 100% + access log 100%", 1.0, 1.0, True),
    Config("on: metrics + traces 10% + access log 10%", 0.1, 0.1, False),
)
CLIENT_HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def simulated_requests(count: int, seed: int) -> list[tuple[RequestTiming, RequestOutcome]]:
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        t = 1000.0 + i * 0.01
        kind = rng.random()
        model = rng.choice(MODELS)
        backend = rng.choice(BACKENDS)
        timing = RequestTiming(arrival=t, cache_start=t + 0.0002, cache_end=t + 0.0006)
        fields: dict[str, object] = dict(
            request_id=f"req-{i}", operation="chat", request_model=model, status=200,
            stream=True, response_model=model, tenant="bench", input_tokens=rng.randint(20, 4000),
            output_tokens=rng.randint(1, 800),
        )  # fmt: skip
        if kind < 0.15:  # cache hit
            timing.first_byte = t + 0.001
            timing.end = t + 0.002
            fields.update(cache=rng.choice(("exact", "semantic")))
        else:
            wait = rng.expovariate(20.0) if rng.random() < 0.3 else 0.0
            timing.queue_start = t + 0.0007
            timing.queue_end = timing.queue_start + wait
            if kind > 0.95:  # rejected after waiting
                timing.end = timing.queue_end
                fields.update(status=429, stream=False, admission="rejected",
                              rejection_reason="queue_full", input_tokens=None,
                              output_tokens=None, response_model=None)  # fmt: skip
            else:
                timing.route_start = timing.queue_end
                timing.route_end = timing.queue_end + 0.0001
                timing.dispatch = timing.route_end + 0.0001
                timing.first_byte = timing.dispatch + rng.uniform(0.02, 0.3)
                timing.end = timing.first_byte + rng.uniform(0.1, 10.0)
                fields.update(
                    backend=backend, policy="kv", cache="miss",
                    admission="queued" if wait else "admitted",
                    stream=kind < 0.85, small_model=rng.random() < 0.2,
                )  # fmt: skip
        requests.append((timing, RequestOutcome(**fields)))  # type: ignore[arg-type]
    return requests


@dataclass(frozen=True)
class Result:
    cpu_us: float
    wall_us: float
    render_ms: float
    spans: int
    log_lines: int


class _Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0
        self.stream = open(os.devnull, "w")  # noqa: SIM115 - closed in close()

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.stream.write(self.format(record) + "\n")

    def close(self) -> None:
        self.stream.close()
        super().close()


def run(config: Config, requests: list[tuple[RequestTiming, RequestOutcome]]) -> Result:
    exporter = DiscardExporter()
    processor: SpanProcessor | None = None
    if config.trace_ratio is not None:
        # A queue that holds every span of a run: the loop here makes spans faster than the
        # export thread gets the GIL, and the default 2048 would drop (not count) most of them.
        processor = BatchSpanProcessor(exporter, max_queue_size=8 * len(requests))
    logger = logging.Logger("kvgate.access", logging.INFO)  # private: no global handlers touched
    handler = _Counter()
    logger.addHandler(handler)
    telemetry = Telemetry(
        TelemetrySettings(
            trace_sample_ratio=config.trace_ratio or 1.0, access_log_sample_rate=config.log_rate
        ),
        rng=random.Random(1),
        span_processor=processor,
        logger=logger,
    )
    telemetry.register_backend_gauges(
        lambda: [BackendGauges(b, healthy=True, kv_usage=0.5, running=3) for b in BACKENDS]
    )
    client_headers = CLIENT_HEADERS if config.client_traceparent else None
    try:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for timing, outcome in requests:
            trace = telemetry.request_started(timing, client_headers)
            if timing.dispatch is not None:
                trace.inject({})
            telemetry.request_finished(timing, outcome, trace)
        if processor is not None:
            processor.force_flush()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        render0 = time.perf_counter()
        body = telemetry.render_prometheus()
        render_ms = (time.perf_counter() - render0) * 1000.0
        assert body
    finally:
        telemetry.shutdown()
        handler.close()
    n = len(requests)
    return Result(cpu / n * 1e6, wall / n * 1e6, render_ms, exporter.spans, handler.count)


def calibration_us() -> float:
    """A fixed pure-Python workload, so figures from different machines can be compared."""
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(1000):
            sum(range(1000))
        best = min(best, (time.perf_counter() - start) * 1000.0)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_telemetry")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per config; median reported")
    parser.add_argument("--seed", type=int, default=42)
    add_arguments(parser)
    args = parser.parse_args(argv)
    requests = simulated_requests(args.requests, args.seed)
    results: dict[str, list[Result]] = {config.name: [] for config in CONFIGS}
    for _ in range(args.repeat):
        for config in CONFIGS:  # interleaved, so drift hits every config alike
            results[config.name].append(run(config, requests))
    print(f"telemetry calls per request: {args.requests} simulated requests per run, "
          f"median of {args.repeat} runs, Python {sys.version.split()[0]}")  # fmt: skip
    calibration = calibration_us()
    print(f"machine speed, for scale: sum(range(1000)) takes {calibration:.1f} us")
    print(f"{'config':<46} {'CPU us/req':>10} {'wall us/req':>11} {'spans':>8} {'log lines':>9} "
          f"{'/metrics ms':>11}")  # fmt: skip
    rows: list[list[object]] = []
    base = statistics.median(r.cpu_us for r in results[CONFIGS[0].name])
    for config in CONFIGS:
        runs = results[config.name]
        cpu = statistics.median(r.cpu_us for r in runs)
        print(
            f"{config.name:<46} {cpu:>10.1f}"
            f" {statistics.median(r.wall_us for r in runs):>11.1f} {runs[-1].spans:>8}"
            f" {runs[-1].log_lines:>9} {statistics.median(r.render_ms for r in runs):>11.2f}"
        )
        rows.append([config.name, round(cpu, 1), round(cpu / base, 2),
                     round(statistics.median(r.wall_us for r in runs), 1), runs[-1].spans,
                     runs[-1].log_lines, round(statistics.median(r.render_ms for r in runs), 2)])
    save(args, "bench_telemetry", title="Telemetry calls alone: CPU per request",
         command=command("loadtest.bench_telemetry", sys.argv[1:] if argv is None else argv),
         tables=[Table(f"{args.requests} simulated requests per run, median of {args.repeat} "
                       "runs, the configurations interleaved",
                       ["configuration", "CPU µs/request", "vs off", "wall µs/request", "spans",
                        "log lines", "/metrics render ms"], rows,
                       "`vs off` is the CPU time's ratio to the first row's, measured in the "
                       "same run.")],
         notes=f"For the machine's speed: sum(range(1000)) took {calibration:.1f} µs there.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
