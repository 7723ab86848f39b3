"""The glue between the gateway's request path and `Telemetry`: one middleware, one `on_done`.

- `Observer.middleware` is the app's first middleware. It stamps the arrival (the start of TTFT)
  before anything else runs, opens the request's `Observation` (gateway/observation.py) on the two
  completion endpoints, and closes it when the handler returns, fails or is cancelled: every
  completion request is recorded exactly once (metrics, spans, one access-log line).
- `Observer.on_done` is the proxy's `on_done`: it files the proxy's `Outcome` with the request it
  belongs to (found by its `RequestTiming`), then calls the app's own `on_done`, if any.
- `stamp_timing` writes `server-timing` and `x-kvgate-queue-ms` when the response headers go out.
  For a JSON answer that is after the request ended, so every part is there (`ttft`, `total`).
  A stream's headers leave before its first token: its `server-timing` holds the parts known by
  then, `queue`, `cache`, `route` and `connect` (dispatch → the backend's response headers);
  `upstream`, `ttft` and `total` of a stream are in the metrics, the spans and the access log.
- W3C trace context: with tracing on, the backend gets the upstream span's `traceparent`, a child
  of the client's; with tracing off, the client's `traceparent`/`tracestate` go on unchanged.
- `GET /metrics` renders the request histograms and the one MeterProvider; per-backend gauges
  read the Fleet at scrape time.

Cost: with tracing off and the access log not sampled, a request costs a few small allocations
and one `Telemetry.request_finished` (see loadtest/bench_gateway_telemetry.py for the figures).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.admission import GATE, body_usage
from gateway.keys import ARRIVED_AT, FLEET, OBSERVATION, REQUEST_ID, TELEMETRY, TIMING
from gateway.observation import Observation
from gateway.proxy import CLIENT_CLOSED, Outcome
from gateway.telemetry import (
    NOOP_TRACE,
    PROMETHEUS_CONTENT_TYPE,
    BackendGauges,
    RequestOutcome,
    RequestTiming,
    RequestTrace,
    Telemetry,
    server_timing,
)
from routing.fleet import Fleet

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The endpoints whose requests are recorded, and their gen_ai.operation.name.
OPERATIONS: Mapping[str, str] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
}
UNKNOWN_MODEL = "unknown"  # gen_ai.request.model of a request whose body was not valid
# error.type classes of our own; any other failure is labelled by its HTTP status.
CLIENT_CLOSED_ERROR = "client_closed"
STREAM_FAILED_ERROR = "upstream_stream_failed"  # the stream broke or carried an error event
INTERNAL_STATUS = 500
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


class Observer:
    """One per app; see the module docstring."""

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
        # Requests in progress, by id() of their RequestTiming: how an Outcome finds its request.
        # An entry lives exactly as long as its request's middleware frame, which holds the timing.
        self._open: dict[int, Observation] = {}
        self.middleware = self._middleware()

    def _middleware(self) -> Middleware:
        clock = self.clock

        @web.middleware
        async def telemetry_middleware(
            request: web.Request, handler: Handler
        ) -> web.StreamResponse:
            arrival = clock()  # first thing: TTFT and the queue time start here
            request[ARRIVED_AT] = arrival
            operation = OPERATIONS.get(request.path)
            if operation is None:
                return await handler(request)
            observation = self._start(request, operation, arrival)
            try:
                response = await handler(request)
            except asyncio.CancelledError:  # the client hung up
                self._finish(request, observation, None, CLIENT_CLOSED)
                raise
            except BaseException:  # the error middleware answers everything else; be safe anyway
                self._finish(request, observation, None, INTERNAL_STATUS)
                raise
            self._finish(request, observation, response, response.status)
            return response

        return telemetry_middleware

    def _start(self, request: web.Request, operation: str, arrival: float) -> Observation:
        timing = RequestTiming(arrival=arrival)
        headers = request.headers
        if self._tracing:
            trace = self.telemetry.request_started(timing, headers)
        else:
            trace = forwarded_trace(headers)
        observation = Observation(operation, timing, trace, keep_prompt=self._keep_prompt)
        request[OBSERVATION] = observation
        request[TIMING] = timing
        self._open[id(timing)] = observation
        return observation

    def on_done(self, outcome: Outcome) -> None:
        """The proxy's report for one request: kept for the request's end, then passed on."""
        if outcome.timing is not None:
            observation = self._open.get(id(outcome.timing))
            if observation is not None:
                observation.outcome = outcome
        if self._on_done is not None:
            self._on_done(outcome)

    def _finish(
        self,
        request: web.Request,
        observation: Observation,
        response: web.StreamResponse | None,
        status: int,
    ) -> None:
        now = self.clock()
        timing = observation.timing
        del self._open[id(timing)]
        if (
            response is not None
            and not response.prepared
            and status < 400
            and timing.first_byte is None
        ):
            timing.first_byte = now  # a whole (JSON) answer: its first byte goes out now
        if timing.end is None:
            timing.end = now
        outcome = observation.outcome
        if outcome is not None:
            status = outcome.status  # the proxy knows a disconnect the response does not show
        self.telemetry.request_finished(
            timing, self._request_outcome(request, observation, response, status), observation.trace
        )

    def _request_outcome(
        self,
        request: web.Request,
        observation: Observation,
        response: web.StreamResponse | None,
        status: int,
    ) -> RequestOutcome:
        outcome = observation.outcome
        backend = outcome.backend_id if outcome is not None else None
        usage: object = outcome.usage if outcome is not None else observation.usage
        if usage is None and isinstance(response, web.Response) and status == 200:
            usage = body_usage(response.body)
        input_tokens, output_tokens = _tokens(usage)
        error_type: str | None = None
        if status == CLIENT_CLOSED:
            error_type = CLIENT_CLOSED_ERROR
        elif status < 400 and outcome is not None and outcome.error is not None:
            error_type = STREAM_FAILED_ERROR
        return RequestOutcome(
            request_id=request.get(REQUEST_ID) or "",
            operation=observation.operation,
            request_model=observation.request_model or UNKNOWN_MODEL,
            status=status,
            stream=outcome.stream if outcome is not None else observation.stream,
            response_model=outcome.model if outcome is not None and backend
            else observation.response_model,
            backend=backend,
            policy=outcome.policy if outcome is not None else None,
            cache=observation.cache,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            tenant=observation.tenant or (outcome.tenant if outcome is not None else None),
            admission=observation.admission or (outcome.admission if outcome else None),
            rejection_reason=observation.rejection_reason
            or (outcome.rejection_reason if outcome is not None else None),
            small_model=observation.small_model,
            error_type=error_type,
            prompt=observation.prompt,
        )


def _tokens(usage: object) -> tuple[int | None, int | None]:
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


async def stamp_timing(request: web.Request, response: web.StreamResponse) -> None:
    """`server-timing`, `x-kvgate-queue-ms` (arrival → dispatch) and, on the completion
    endpoints, `x-kvgate-cache` (a hit sets its own), from what is known now."""
    timing = request.get(TIMING)
    if timing is None:
        return
    observation = request.get(OBSERVATION)
    if observation is not None:
        if "x-kvgate-cache" not in response.headers:
            response.headers["x-kvgate-cache"] = observation.cache
        if observation.model_reason is not None:
            response.headers["x-kvgate-model-reason"] = observation.model_reason
    value = server_timing(timing)
    if value:
        response.headers["server-timing"] = value
    queued = timing.pre_dispatch_s
    if queued is not None:
        response.headers["x-kvgate-queue-ms"] = f"{queued * 1000.0:.1f}"


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


def install_telemetry(app: web.Application, observer: Observer) -> None:
    """Everything but the middleware (which `create_app` lists first): the Telemetry under its
    AppKey, /metrics, the header stamping, the gauges (backends, gateway queue) and the shutdown
    at cleanup. Call it once the Fleet and the Gate are in the app."""
    telemetry = observer.telemetry
    app[TELEMETRY] = telemetry
    app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(stamp_timing)
    fleet = app[FLEET]
    clock = observer.clock
    telemetry.register_backend_gauges(lambda: backend_gauges(fleet, clock()))
    dispatcher = app[GATE].dispatcher
    telemetry.register_queue_depth(lambda: dispatcher.queue_depth)

    async def shutdown(app: web.Application) -> None:
        telemetry.shutdown()

    app.on_cleanup.append(shutdown)
