"""Telemetry wired into the gateway: TTFT measured from arrival with the queue inside it, one
record per request in /metrics, the span tree, W3C trace context to the backend, server-timing,
the JSON access log, backend state and poll errors; all over real sockets on loopback."""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ConfigError, Settings, load_settings
from gateway.logsink import BatchedLineHandler, configure_access_log
from gateway.serve import running_gateway
from gateway.telemetry import TelemetrySettings
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from tests.paths import FIXTURES

SIM_MODEL = PRESETS[DEFAULT_PRESET].model_name
MODEL = "m"
DEADLINE_S = 10.0
CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"
CLIENT_TRACE = {
    "traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01",
    "tracestate": "vendor=opaque,other=1",
}


def event(content: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    return b"data: " + orjson.dumps({"model": MODEL, "choices": [choice]}) + b"\n\n"


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
STREAM = [event(""), event("Hello"), event(" there"), event("!", "stop"), USAGE,
          b"data: [DONE]\n\n"]
ANSWER = {"object": "chat.completion", "model": MODEL, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello there!"},
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


class Upstream:
    """A loopback backend that records the headers of each completion request. `hang` makes a
    stream stop after its first event; `broken_metrics` makes its /metrics answer 500."""

    def __init__(self, *, broken_metrics: bool = False) -> None:
        self.headers: list[Mapping[str, str]] = []
        self.hang = False
        self.broken_metrics = broken_metrics
        self.url = ""

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Upstream]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            yield self
        finally:
            await runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.broken_metrics:
            return web.Response(status=500)
        return web.Response(body=(FIXTURES / "vllm-v1.prom").read_bytes(),
                            content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        body = orjson.loads(await request.read())
        if not body.get("stream"):
            return web.json_response(ANSWER)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in STREAM[:2] if self.hang else STREAM:
            await response.write(chunk)
        if self.hang:
            await asyncio.Event().wait()  # cancelled when the gateway hangs up
        await response.write_eof()
        return response


@asynccontextmanager
async def gateway_over(
    *upstreams: Upstream, telemetry: Mapping[str, Any] | None = None, **options: Any
) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        for upstream in upstreams:
            await stack.enter_async_context(upstream.running())
        settings = Settings.model_validate({
            "server": {"port": 0},
            "routing": {"admission": False, "poll_interval_s": 0.05},
            "backends": [{"url": u.url, "id": f"u{i}"} for i, u in enumerate(upstreams)],
            "telemetry": dict(telemetry or {}),
        })
        url = await stack.enter_async_context(running_gateway(settings, **options))
        yield url, await stack.enter_async_context(aiohttp.ClientSession())


def chat(stream: bool, content: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "stream": stream,
                            "messages": [{"role": "user", "content": content}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, frozenset[Any]], float]:
    """Every sample of GET /metrics (checked by prometheus_client's parser), by name and labels."""
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = await response.text()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Mapping[tuple[str, frozenset[Any]], float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, lbls), v in samples.items() if n == name and wanted <= lbls)


async def eventually(check: Callable[[], Any], what: str) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not (result := await check()):
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return result


def tree(spans: list[ReadableSpan]) -> Iterator[tuple[ReadableSpan, dict[str, ReadableSpan]]]:
    """Each root span (kind SERVER) with its descendants by name."""
    children: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        if span.parent is not None:
            children.setdefault(span.parent.span_id, []).append(span)
    for root in spans:
        if root.name.startswith(("chat ", "text_completion ")):
            below: dict[str, ReadableSpan] = {}
            stack = list(children.get(root.context.span_id, []))
            while stack:
                span = stack.pop()
                below[span.name] = span
                stack.extend(children.get(span.context.span_id, []))
            yield root, below


def server_timing(header: str) -> dict[str, float]:
    parts = (part.strip().split(";dur=") for part in header.split(","))
    return {name: float(ms) for name, ms in parts}


async def test_through_a_saturated_gateway_ttft_contains_the_queue_and_every_request_counts_once(
) -> None:
    """Two simulators with a tiny KV cache: most requests wait in the gateway's admission queue."""
    exporter = InMemorySpanExporter()
    count = 24
    async with running_sim(time_scale=20, seed=1, num_gpu_blocks=48) as a, \
            running_sim(time_scale=20, seed=2, num_gpu_blocks=48) as b:
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": a}, {"url": b}],
            "routing": {"poll_interval_s": 0.05},
            "telemetry": {"access_log_sample_rate": 0.0},
        })
        async with running_gateway(settings, span_processor=SimpleSpanProcessor(exporter)) as url, \
                aiohttp.ClientSession() as http:
            async def one(i: int) -> tuple[int, dict[str, float], float]:
                body = {"model": SIM_MODEL, "max_tokens": 24, "stream": True,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "user", "content": f"{i} " + "lorem ipsum " * 40}]}
                async with http.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    return (response.status, server_timing(response.headers["server-timing"]),
                            float(response.headers["x-kvgate-queue-ms"]))

            answers = await asyncio.gather(*(one(i) for i in range(count)))
            samples = await metrics(http, url)

    assert [status for status, _, _ in answers] == [200] * count
    for _, parts, _ in answers:  # a stream's headers leave before its first token
        assert {"queue", "route", "connect"} <= parts.keys()
        assert not {"upstream", "ttft", "total"} & parts.keys()

    roots = list(tree(list(exporter.get_finished_spans())))
    assert len(roots) == count
    queued, ttfts = 0, []
    for root, below in roots:
        assert {"queue.wait", "route", "upstream", "upstream.first_token"} <= below.keys()
        first_token = below["upstream.first_token"]
        assert first_token.parent is not None
        assert first_token.parent.span_id == below["upstream"].context.span_id
        # The parts of TTFT are disjoint: the wait in the queue, then the routing decision.
        assert below["queue.wait"].end_time <= below["route"].start_time  # type: ignore[operator]
        attributes = root.attributes or {}
        queue_ms, ttft_ms = attributes["kvgate.queue_ms"], attributes["kvgate.ttft_ms"]
        assert isinstance(queue_ms, float) and isinstance(ttft_ms, float)
        assert ttft_ms >= queue_ms
        queued += attributes["kvgate.admission.result"] == "queued"
        ttfts.append(ttft_ms)
    assert queued >= count // 4, "the fleet was not saturated: too few requests queued"
    longest_wait = max(wait for _, _, wait in answers)  # x-kvgate-queue-ms
    assert longest_wait > 0 and max(ttfts) >= longest_wait

    ttft = "gen_ai_server_time_to_first_token_seconds"
    queue = "kvgate_queue_time_seconds"
    assert total(samples, ttft + "_count") == count
    assert total(samples, "gen_ai_server_request_duration_seconds_count") == count
    assert total(samples, queue + "_count") == count
    assert total(samples, ttft + "_sum") >= total(samples, queue + "_sum") > 0
    assert total(samples, "gen_ai_client_token_usage_count", gen_ai_token_type="output") == count
    admissions = "kvgate_admission_decisions_total"
    assert total(samples, admissions, kvgate_admission_result="queued") == queued
    assert total(samples, admissions) == count
    assert total(samples, "kvgate_routing_decisions_total") == count
    for backend in ("b0", "b1"):
        assert total(samples, "kvgate_backend_kv_free_blocks", kvgate_backend=backend) >= 0
        assert total(samples, "kvgate_backend_healthy", kvgate_backend=backend) == 1
    assert ("kvgate_queue_depth", frozenset()) in samples


async def test_a_json_answer_has_every_part_in_server_timing_and_its_tokens_counted() -> None:
    async with gateway_over(Upstream()) as (url, http):
        async with http.post(url + "/v1/chat/completions", json=chat(stream=False)) as response:
            assert response.status == 200
            parts = server_timing(response.headers["server-timing"])
        samples = await metrics(http, url)
    assert {"route", "upstream", "gateway", "ttft", "total"} <= parts.keys()
    assert parts["ttft"] <= parts["total"]
    tokens = "gen_ai_client_token_usage_sum"
    assert total(samples, tokens, gen_ai_token_type="input") == 5
    assert total(samples, tokens, gen_ai_token_type="output") == 3
    assert total(samples, "gen_ai_server_time_to_first_token_seconds_count") == 0  # not a stream


@pytest.mark.parametrize(
    ("sent", "forwarded"),
    [
        pytest.param(CLIENT_TRACE, CLIENT_TRACE, id="the client's headers go on unchanged"),
        pytest.param({}, {}, id="no client trace, none invented"),
    ],
)
async def test_with_tracing_off_the_clients_trace_context_reaches_the_backend_unchanged(
    sent: dict[str, str], forwarded: dict[str, str]
) -> None:
    upstream = Upstream()
    async with gateway_over(upstream) as (url, http):
        for stream in (True, False):
            async with http.post(url + "/v1/chat/completions", json=chat(stream),
                                 headers=sent) as response:
                assert response.status == 200
                await response.read()
    for headers in upstream.headers:
        got = {k.lower(): v for k, v in headers.items() if k.lower() in CLIENT_TRACE}
        assert got == forwarded


async def test_with_tracing_on_the_backend_gets_the_upstream_span_as_parent() -> None:
    exporter = InMemorySpanExporter()
    upstream = Upstream()
    async with gateway_over(upstream, span_processor=SimpleSpanProcessor(exporter)) as (url, http):
        async with http.post(url + "/v1/chat/completions", json=chat(True),
                             headers=CLIENT_TRACE) as response:
            await response.read()
    [(root, below)] = list(tree(list(exporter.get_finished_spans())))
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN_ID
    version, trace_id, parent_id, flags = upstream.headers[0]["traceparent"].split("-")
    assert trace_id == CLIENT_TRACE_ID and flags == "01"
    assert parent_id == format(below["upstream"].context.span_id, "016x")
    assert upstream.headers[0]["tracestate"] == CLIENT_TRACE["tracestate"]
    assert {"route", "upstream", "upstream.first_token"} <= below.keys()
    assert (root.attributes or {})["gen_ai.request.model"] == MODEL


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "kvgate.access"]


@pytest.mark.parametrize(
    ("telemetry", "lines", "prompt"),
    [
        pytest.param({}, 3, None, id="every request, never the prompt by default"),
        pytest.param({"access_log_prompts": True}, 3, "tell me a secret",
                     id="the prompt only when enabled"),
        pytest.param({"access_log_sample_rate": 0.0}, 0, None, id="sampled out"),
    ],
)
async def test_the_access_log_is_one_json_line_per_request(
    caplog: pytest.LogCaptureFixture, telemetry: dict[str, Any], lines: int, prompt: str | None
) -> None:
    caplog.set_level(logging.INFO, logger="kvgate.access")
    async with gateway_over(Upstream(), telemetry=telemetry) as (url, http):
        for i, stream in enumerate((True, False, True)):
            async with http.post(url + "/v1/chat/completions", json=chat(stream,
                                 "tell me a secret"), headers={"x-request-id": f"r{i}"}) as resp:
                await resp.read()
    records = access_lines(caplog)
    assert [r["request_id"] for r in records] == [f"r{i}" for i in range(lines)]
    for record in records:
        assert record["status"] == 200 and record["backend"] == "u0"
        assert record["ttft_ms"] > 0 and record["duration_ms"] >= record["ttft_ms"]
        assert (record["tpot_ms"] is not None) == record["stream"]  # a streaming figure
        assert record.get("prompt") == prompt
        assert ("tell me a secret" in orjson.dumps(record).decode()) == (prompt is not None)


async def test_failed_scrapes_are_counted_by_backend_and_state_is_exported() -> None:
    async with gateway_over(Upstream(), Upstream(broken_metrics=True)) as (url, http):
        async def errors() -> dict[tuple[str, frozenset[Any]], float] | None:
            samples = await metrics(http, url)
            name = "kvgate_backend_poll_errors_total"
            return samples if total(samples, name, kvgate_backend="u1") >= 3 else None

        samples = await eventually(errors, "poll errors of u1")
    assert total(samples, "kvgate_backend_poll_errors_total", kvgate_backend="u0") == 0
    assert total(samples, "kvgate_backend_poll_errors_total", kvgate_backend="u1",
                 kvgate_poll_error="ScrapeError") >= 3
    # Broken metrics only cost freshness: the backend stays in rotation.
    assert total(samples, "kvgate_backend_healthy", kvgate_backend="u1") == 1
    assert total(samples, "kvgate_backend_running", kvgate_backend="u0") == 24  # the fixture's
    assert total(samples, "kvgate_backend_kv_usage_ratio", kvgate_backend="u0") == \
        pytest.approx(0.421682776801406)
    assert total(samples, "kvgate_backend_poll_age_seconds", kvgate_backend="u0") >= 0


async def test_a_client_that_hangs_up_mid_stream_is_recorded_once_as_client_closed() -> None:
    upstream = Upstream()
    upstream.hang = True
    async with gateway_over(upstream) as (url, http):
        async with aiohttp.ClientSession() as client:
            async with client.post(url + "/v1/chat/completions", json=chat(True)) as response:
                await response.content.readline()  # the first event arrived; now hang up

        async def recorded() -> dict[tuple[str, frozenset[Any]], float] | None:
            samples = await metrics(http, url)
            name = "gen_ai_server_request_duration_seconds_count"
            return samples if total(samples, name) else None

        samples = await eventually(recorded, "the request's record")
    name = "gen_ai_server_request_duration_seconds_count"
    assert total(samples, name) == 1
    assert total(samples, name, error_type="client_closed") == 1


@pytest.mark.parametrize(
    ("body", "status", "model"),
    [
        pytest.param(b"{not json", 400, "unknown", id="invalid body: model unknown"),
        pytest.param(orjson.dumps({"model": "nope", "messages": [{"role": "user"}]}), 404,
                     "nope", id="unknown model: the model asked for"),
    ],
)
async def test_a_request_refused_before_routing_is_still_recorded_once(
    body: bytes, status: int, model: str
) -> None:
    async with gateway_over(Upstream()) as (url, http):
        async with http.post(url + "/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == status
        samples = await metrics(http, url)
    name = "gen_ai_server_request_duration_seconds_count"
    assert total(samples, name) == 1
    assert total(samples, name, error_type=str(status), gen_ai_request_model=model) == 1


async def test_a_refused_request_carries_the_exchanges_headers_and_its_logged_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No x-request-id sent: the one the gateway made up is the response's and the log's."""
    caplog.set_level(logging.INFO, logger="kvgate.access")
    body = orjson.dumps({"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    async with gateway_over(Upstream()) as (url, http):
        async with http.post(url + "/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 404
            headers = response.headers
    (record,) = access_lines(caplog)
    assert headers["x-request-id"] == record["request_id"]
    assert headers["x-kvgate-cache"] == "bypass"  # refused before any lookup
    assert "total" in server_timing(headers["server-timing"])
    assert int(headers["openai-processing-ms"]) >= 0


def test_the_telemetry_section_maps_onto_the_telemetry_settings() -> None:
    settings = load_settings(None, environ={
        "KVGATE_TELEMETRY__TRACE_SAMPLE_RATIO": "0.25",
        "KVGATE_TELEMETRY__ACCESS_LOG_SAMPLE_RATE": "0.1",
        "KVGATE_TELEMETRY__ACCESS_LOG_PROMPTS": "true",
        "KVGATE_TELEMETRY__SERVICE_NAME": "edge",
    })
    assert settings.telemetry.to_settings() == TelemetrySettings(
        service_name="edge", trace_sample_ratio=0.25, access_log_sample_rate=0.1,
        access_log_prompts=True,
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        pytest.param("KVGATE_TELEMETRY__OTLP_ENDPOINT", "http://127.0.0.1:4318",
                     "pip install 'kvgate[otlp]'", id="OTLP without the exporter installed"),
        pytest.param("KVGATE_TELEMETRY__OTLP_PROTOCOL", "udp", "must be one of",
                     id="unknown protocol"),
        pytest.param("KVGATE_TELEMETRY__ACCESS_LOG_SAMPLE_RATE", "1.5", "less than or equal",
                     id="sample rate above 1"),
    ],
)
def test_a_bad_telemetry_setting_fails_at_start_naming_it(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(None, environ={variable: value})
    field = "telemetry." + variable.removeprefix("KVGATE_TELEMETRY__").lower()
    assert str(error.value).startswith(f"{variable}: {field}: ") and message in str(error.value)


class Writes(io.StringIO):
    """A stream that counts its write calls (each one a system call on a real stdout)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.writes += 1
            return super().write(text)


def log_to(handler: logging.Handler, *messages: str) -> None:
    for message in messages:
        handler.handle(logging.LogRecord("kvgate.access", logging.INFO, __file__, 0, message,
                                         None, None))


def test_access_lines_are_written_in_one_call_once_the_batch_is_full() -> None:
    stream = Writes()
    handler = BatchedLineHandler(stream, max_bytes=40, max_delay_s=60.0)
    try:
        log_to(handler, *(f'{{"n":{i}}}' for i in range(5)))  # 8 bytes a line: full at the 5th
        assert stream.writes == 1
        assert stream.getvalue() == "".join(f'{{"n":{i}}}\n' for i in range(5))
        log_to(handler, '{"n":5}')
        assert stream.writes == 1  # pending, not yet written
    finally:
        handler.close()
    assert stream.getvalue().endswith('{"n":5}\n') and stream.writes == 2  # close flushes


def test_a_pending_access_line_is_written_within_the_delay() -> None:
    stream = Writes()
    handler = BatchedLineHandler(stream, max_bytes=1 << 20, max_delay_s=0.05)
    try:
        log_to(handler, '{"a":1}', '{"b":2}')
        deadline = time.monotonic() + DEADLINE_S
        while not stream.getvalue():
            assert time.monotonic() < deadline, "the flusher never wrote"
            time.sleep(0.01)
        assert stream.getvalue() == '{"a":1}\n{"b":2}\n' and stream.writes == 1
    finally:
        handler.close()


def test_the_cli_sends_access_lines_to_their_own_handler_at_the_chosen_level() -> None:
    logger = logging.getLogger("kvgate.access")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    stream = Writes()
    try:
        configure_access_log("warning", stream)
        replaced = configure_access_log("info", stream)  # a second call replaces the first
        assert [h for h in logger.handlers if isinstance(h, BatchedLineHandler)] == [replaced]
        assert logger.isEnabledFor(logging.INFO) and not logger.propagate
        logger.info('{"x":1}')
        replaced.flush()
        assert stream.getvalue() == '{"x":1}\n'
        configure_access_log("warning", stream)
        assert not logger.isEnabledFor(logging.INFO)  # no access line is even built
    finally:
        for handler in list(logger.handlers):
            if isinstance(handler, BatchedLineHandler):
                logger.removeHandler(handler)
                handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers[:] = saved[2]
