"""The glue between the completion path and `Telemetry`: open an exchange, record it once.

- `Recorder.arrive` opens a completion request's `Exchange` (gateway/exchange.py) first thing:
  its arrival is the start of TTFT. `Recorder.finish` records it when the completion path ends
  it, on every path (answered, refused, failed, cancelled): metrics, spans and one access-log
  line, from the exchange and the proxy's `Outcome`, then the app's `on_done`, if any, with the
  `Outcome`.
- W3C trace context: with tracing on, the backend gets the upstream span's `traceparent`, a child
  of the client's; with tracing off, the client's `traceparent`/`tracestate` go on unchanged.
- `GET /metrics` renders the request histograms and the one MeterProvider; per-backend gauges
  read the Fleet at scrape time.

With tracing off and the access log not sampled, a request costs a few small allocations and
one `Telemetry.request_finished`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping

from aiohttp import web

from gateway.admission import GATE
from gateway.attempt import CLIENT_CLOSED, Outcome
from gateway.exchange import Endpoint, Exchange, request_id_of
from gateway.keys import FLEET, TELEMETRY
from gateway.telemetry import (
    NOOP_TRACE,
    PROMETHEUS_CONTENT_TYPE,
    BackendGauges,
    RequestOutcome,
    RequestTiming,
    RequestTrace,
    Telemetry,
)
from routing.fleet import Fleet

UNKNOWN_MODEL = "unknown"  # gen_ai.request.model of a request whose body was not valid
# error.type classes of our own; any other failure is labelled by its HTTP status.
CLIENT_CLOSED_ERROR = "client_closed"
STREAM_FAILED_ERROR = "upstream_stream_failed"  # the stream broke or carried an error event
_TRACE_HEADERS = ("traceparent", "tracestate")


class ForwardedTrace:
    """A request's trace while tracing is off: the client's W3C headers, passed on unchanged."""

    __slots__ = ("_headers",)

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    @property
    def trace_id(self) -> str | None:
        return None

    def inject(self, headers: MutableMapping[str, str]) -> None:
        headers.update(self._headers)


def forwarded_trace(headers: Mapping[str, str]) -> RequestTrace:
    """The client's `traceparent` and `tracestate` to forward, or NOOP_TRACE when it sent none."""
    found = {name: value for name in _TRACE_HEADERS if (value := headers.get(name)) is not None}
    return ForwardedTrace(found) if found else NOOP_TRACE


class Recorder:
    """One per app: opens each completion request's `Exchange` and records it when it ends."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        clock: Callable[[], float],
        on_done: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.telemetry = telemetry
        self.clock = clock
        self._on_done = on_done
        self._keep_prompt = telemetry.settings.access_log_prompts
        self._tracing = telemetry.tracing_enabled

    def arrive(self, headers: Mapping[str, str], endpoint: Endpoint) -> Exchange:
        """The exchange of a request arriving now: its id, timing and trace."""
        timing = RequestTiming(arrival=self.clock())  # TTFT and the queue time start here
        if self._tracing:
            trace = self.telemetry.request_started(timing, headers)
        else:
            trace = forwarded_trace(headers)
        return Exchange(request_id_of(headers), endpoint, headers, timing, trace,
                        keep_prompt=self._keep_prompt)

    def finish(self, ex: Exchange, status: int, *, whole: bool) -> None:
        """The request ended with `status`; `whole` when its answer is a body not sent yet (its
        first byte goes out now). Call it exactly once, on every path."""
        now = self.clock()
        timing = ex.timing
        if whole and status < 400 and timing.first_byte is None:
            timing.first_byte = now
        if timing.end is None:
            timing.end = now
        outcome = ex.outcome
        if outcome is not None:
            status = outcome.status  # the proxy knows a disconnect the response does not show
        self.telemetry.request_finished(timing, request_outcome(ex, status), ex.trace)
        if outcome is not None and self._on_done is not None:
            self._on_done(outcome)


def request_outcome(ex: Exchange, status: int) -> RequestOutcome:
    """What telemetry records of an exchange that ended with `status`."""
    outcome, asked = ex.outcome, ex.asked
    backend = outcome.backend_id if outcome is not None else None
    usage = outcome.usage if outcome is not None else ex.hit_usage
    input_tokens, output_tokens = _tokens(usage)
    error_type: str | None = None
    if status == CLIENT_CLOSED:
        error_type = CLIENT_CLOSED_ERROR
    elif status < 400 and outcome is not None and outcome.error is not None:
        error_type = STREAM_FAILED_ERROR
    return RequestOutcome(
        request_id=ex.request_id,
        operation=ex.endpoint.operation,
        request_model=asked.model if asked is not None else UNKNOWN_MODEL,
        status=status,
        stream=outcome.stream if outcome is not None else asked is not None and asked.stream,
        response_model=outcome.model if outcome is not None and backend else ex.hit_model,
        backend=backend,
        policy=outcome.policy if outcome is not None else None,
        cache=ex.cache,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        tenant=outcome.tenant if outcome is not None else None,
        admission=outcome.admission if outcome is not None else None,
        rejection_reason=outcome.rejection_reason if outcome is not None else None,
        small_model=ex.small_model,
        error_type=error_type,
        prompt=asked.prompt_text if ex.keep_prompt and asked is not None else None,
    )


def _tokens(usage: object) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text. Rendering runs the gauges' callbacks (Fleet reads)."""
    body = request.app[TELEMETRY].render_prometheus()
    return web.Response(body=body, headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


def backend_gauges(fleet: Fleet, now: float) -> Iterator[BackendGauges]:
    """Every backend's last scraped state and the gateway's ledger for it, as of `now`."""
    for spec in fleet.specs:
        candidate = fleet.candidate(spec.id, now)
        snap = candidate.snapshot
        yield BackendGauges(
            backend=spec.id,
            healthy=candidate.healthy,
            kv_usage=snap.kv_usage if snap is not None else None,
            kv_free_blocks=snap.kv_free_blocks if snap is not None else None,
            running=snap.running if snap is not None else None,
            waiting=snap.waiting if snap is not None else None,
            poll_age_s=snap.age(now) if snap is not None else None,
            inflight=candidate.inflight,
            reserved_blocks=candidate.reserved_blocks,
        )


def install_telemetry(app: web.Application, recorder: Recorder) -> None:
    """The Telemetry and the Recorder under their AppKeys, /metrics, the gauges (backends,
    gateway queue) and the shutdown at cleanup. Call it once the Fleet and the Gate are in the
    app."""
    telemetry = recorder.telemetry
    app[TELEMETRY] = telemetry
    app[RECORDER] = recorder
    app.router.add_get("/metrics", metrics)
    fleet = app[FLEET]
    clock = recorder.clock
    telemetry.register_backend_gauges(lambda: backend_gauges(fleet, clock()))
    dispatcher = app[GATE].dispatcher
    telemetry.register_queue_depth(lambda: dispatcher.queue_depth)

    async def shutdown(app: web.Application) -> None:
        telemetry.shutdown()

    app.on_cleanup.append(shutdown)


RECORDER = web.AppKey("recorder", Recorder)
