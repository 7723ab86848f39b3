"""The proxy's failure rules, against loopback upstreams that fail on command over real sockets:
retry once elsewhere before the first byte (a connection failure, a reset, a 5xx, a 429, no first
byte in time), never after; a failure after it ends the stream with an
SSE error event and [DONE]; a backend's 4xx passes through and is never retried; in-flight counts
return to zero on every path."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

import gateway.proxy
from gateway.config import Settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway
from gateway.sse import StreamObserver
from tests.paths import FIXTURES
from tests.upstreams import serve_on_loopback

MODEL = "m"
DEADLINE_S = 5.0


def chunk(content: str, finish: str | None = None) -> bytes:
    delta = {"content": content}
    event = {"object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


USAGE = (b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
         b'"total_tokens":8}}\n\n')
GOOD_STREAM = [chunk(""), chunk("Hello"), chunk(" there"), chunk("!", "stop"), USAGE,
               b"data: [DONE]\n\n"]
# What a client that did not ask for usage gets: the same stream without the usage event.
STREAM_WITHOUT_USAGE = b"".join(e for e in GOOD_STREAM if e is not USAGE)
GOOD_JSON = {"object": "chat.completion", "model": MODEL, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello there!"},
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                          "total_tokens": 8}}


class Upstream:
    """A loopback backend. `mode` says how it answers the next completion requests:
    ok | reset_before_headers | status | die_mid_stream | end_early | silent."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.status = 200
        self.error_body = b""
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []  # the completion requests received
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self._runner, self.url = await serve_on_loopback(app)
        return self.url

    async def stop(self) -> None:
        """Stops listening and drops open connections: new requests are refused.

        aiohttp's cleanup leaves the server side of a connection it accepted while stopping to the
        garbage collector; collect that here, where the socket is known to be this test server's."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=(FIXTURES / "vllm-v1.prom").read_bytes(),
                            content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        transport = request.transport
        assert transport is not None
        if self.mode == "reset_before_headers":
            transport.abort()
            return web.Response()
        if self.mode == "status":
            return web.Response(status=self.status, body=self.error_body,
                                content_type="application/json")
        if self.mode == "silent":
            await asyncio.Event().wait()  # cancelled when the gateway hangs up
        if not body.get("stream"):
            return web.json_response(GOOD_JSON)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = GOOD_STREAM[:2] if self.mode in ("die_mid_stream", "end_early") else GOOD_STREAM
        if not (body.get("stream_options") or {}).get("include_usage"):  # as vLLM does
            events = [e for e in events if e is not USAGE]
        for event in events:
            await response.write(event)
        if self.mode == "die_mid_stream":
            transport.abort()
            return response
        await response.write_eof()
        return response


@asynccontextmanager
async def gateway_over(
    count: int, on_done: Callable[[Outcome], None] | None = None, **server: Any
) -> AsyncIterator[tuple[str, list[Upstream], aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        upstreams = [Upstream() for _ in range(count)]
        for upstream in upstreams:
            await upstream.start()
            stack.push_async_callback(upstream.stop)
        settings = Settings.model_validate({
            "server": {"port": 0, **server},
            # The one scrape at start-up is awaited below; no other interferes during a test.
            "routing": {"poll_interval_s": 60, "policy": "round_robin"},
            "backends": [{"url": u.url, "id": f"u{i}"} for i, u in enumerate(upstreams)],
        })
        url = await stack.enter_async_context(running_gateway(settings, on_done=on_done))
        client = await stack.enter_async_context(aiohttp.ClientSession())

        async def scraped() -> bool:
            async with client.get(url + "/admin/backends") as resp:
                rows = (await resp.json(loads=orjson.loads))["backends"]
            return all(row["last_poll_age_ms"] is not None for row in rows)

        await wait_for(scraped, "the first scrape of every backend")
        yield url, upstreams, client


def chat(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def wait_for(predicate: Callable[[], Any], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not await predicate():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def inflight_returns_to_zero(client: aiohttp.ClientSession, url: str) -> None:
    async def zero() -> bool:
        async with client.get(url + "/admin/backends") as resp:
            rows = (await resp.json(loads=orjson.loads))["backends"]
        return all(row["inflight"] == 0 for row in rows)

    await wait_for(zero, "in-flight counts to return to zero")


async def post(client: aiohttp.ClientSession, url: str, body: dict[str, Any]
               ) -> tuple[int, bytes, dict[str, str]]:
    async with client.post(url + "/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.read(), dict(resp.headers)


def events_of(raw: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]


async def break_first(upstream: Upstream, how: str) -> None:
    if how == "connection refused":
        await upstream.stop()
    elif how == "reset before the headers":
        upstream.mode = "reset_before_headers"
    else:
        upstream.mode, upstream.status = "status", int(how.split()[0])
        upstream.error_body = b'{"object":"error","message":"overloaded","code":503}'


FIRST_BYTE_FAILURES = ["connection refused", "reset before the headers", "500 answer",
                       "502 answer", "503 answer", "429 answer"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not streamed"])
@pytest.mark.parametrize("how", FIRST_BYTE_FAILURES)
async def test_a_failure_before_the_first_byte_is_retried_on_another_backend(
    how: str, stream: bool
) -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(2, on_done=outcomes.append) as (url, (bad, good), client):
        await break_first(bad, how)
        # Round robin alternates: within two requests, one tries the bad backend first.
        while not any(o.attempts == 2 for o in outcomes):
            assert len(outcomes) < 2, "the bad backend was never tried"
            status, body, headers = await post(client, url, chat(stream))
            assert status == 200
            assert headers["x-kvgate-backend"] == "u1"
            if stream:
                assert body == STREAM_WITHOUT_USAGE
            else:
                assert orjson.loads(body) == GOOD_JSON
        assert good.calls == len(outcomes)
        assert bad.calls == (0 if how == "connection refused" else 1)  # one try, no more
        await inflight_returns_to_zero(client, url)


async def test_when_every_backend_fails_to_connect_the_client_gets_502() -> None:
    async with gateway_over(2) as (url, upstreams, client):
        for upstream in upstreams:
            await upstream.stop()
        status, body, _ = await post(client, url, chat(True))
        assert status == 502
        assert orjson.loads(body)["error"]["code"] == "upstream_unreachable"
        await inflight_returns_to_zero(client, url)


async def test_when_every_backend_answers_503_the_last_answer_is_relayed_in_openai_shape() -> None:
    async with gateway_over(2) as (url, upstreams, client):
        for upstream in upstreams:
            await break_first(upstream, "503 answer")
        status, body, _ = await post(client, url, chat(False))
        assert status == 503
        assert orjson.loads(body) == {"error": {"message": "overloaded",
                                                "type": "service_unavailable", "param": None,
                                                "code": None}}
        assert sum(u.calls for u in upstreams) == 2  # one try each, no more
        await inflight_returns_to_zero(client, url)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not streamed"])
async def test_a_backend_4xx_passes_through_normalised_and_is_never_retried(stream: bool) -> None:
    legacy = (FIXTURES / "vllm-error-legacy.json").read_bytes()
    message = orjson.loads(legacy)["message"]
    expected = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": None}}
    async with gateway_over(2) as (url, upstreams, client):
        for upstream in upstreams:
            upstream.mode, upstream.status, upstream.error_body = "status", 400, legacy
        status, body, headers = await post(client, url, chat(stream))
        assert status == 400
        assert orjson.loads(body) == expected
        assert sum(u.calls for u in upstreams) == 1
        assert headers["x-kvgate-backend"] in ("u0", "u1")
        await inflight_returns_to_zero(client, url)


class FaultyObserver(StreamObserver):
    """A bug of the gateway's own: reading the chunk that finishes the reply raises."""

    def feed(self, chunk: bytes) -> bytes:
        if b'"finish_reason":"stop"' in chunk:
            raise RuntimeError("a bug")
        return super().feed(chunk)


async def test_a_fault_of_the_gateway_mid_stream_ends_the_stream_with_an_error_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a second response written into the started one (the client would see a corrupt
    chunked body); the request is recorded as a 500 and its lease released."""
    monkeypatch.setattr(gateway.proxy, "StreamObserver", FaultyObserver)
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append) as (url, _, client):
        status, body, _ = await post(client, url, chat(True))
        assert status == 200
        events = events_of(body)
        assert events[-1] == b"[DONE]"
        error = orjson.loads(events[-2])["error"]
        assert error["code"] == "internal_error" and "RuntimeError" in error["message"]
        await inflight_returns_to_zero(client, url)
    (outcome,) = outcomes
    assert outcome.status == 500


async def test_a_backend_dying_mid_stream_ends_the_stream_with_an_error_event_and_done() -> None:
    async with gateway_over(1) as (url, (upstream,), client):
        upstream.mode = "die_mid_stream"
        status, body, _ = await post(client, url, chat(True))
        assert status == 200
        events = events_of(body)
        assert events[:2] == [e.removeprefix(b"data: ").rstrip(b"\n") for e in GOOD_STREAM[:2]]
        error = orjson.loads(events[2])["error"]
        assert error["code"] == "upstream_stream_failed" and "u0" in error["message"]
        assert events[3:] == [b"[DONE]"]
        assert upstream.calls == 1  # never retried once bytes reached the client
        await inflight_returns_to_zero(client, url)


async def test_a_stream_the_backend_closes_cleanly_but_unfinished_ends_with_an_error() -> None:
    async with gateway_over(1) as (url, (upstream,), client):
        upstream.mode = "end_early"
        status, body, _ = await post(client, url, chat(True))
        assert status == 200
        events = events_of(body)
        assert len(events) == 4 and events[3] == b"[DONE]"
        assert orjson.loads(events[2])["error"]["code"] == "upstream_stream_failed"
        await inflight_returns_to_zero(client, url)


async def test_when_every_backend_is_silent_the_client_gets_504_after_one_retry() -> None:
    async with gateway_over(2, first_byte_timeout_s=0.3) as (url, upstreams, client):
        for upstream in upstreams:
            upstream.mode = "silent"
        status, body, _ = await post(client, url, chat(True))
        assert status == 504
        assert orjson.loads(body)["error"]["code"] == "upstream_timeout"
        assert sum(u.calls for u in upstreams) == 2  # one try each, no more
        await inflight_returns_to_zero(client, url)


async def test_streamed_bytes_reach_the_client_unchanged_and_the_facts_are_recorded() -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append) as (url, _, client):
        asked = chat(True) | {"stream_options": {"include_usage": True}}
        status, body, headers = await post(client, url, asked)
        assert status == 200
        assert body == b"".join(GOOD_STREAM)
        assert headers["Content-Type"].startswith("text/event-stream")
        assert headers["x-kvgate-model"] == MODEL
        await inflight_returns_to_zero(client, url)
    (outcome,) = outcomes
    assert (outcome.backend_id, outcome.policy, outcome.attempts) == ("u0", "round_robin", 1)
    assert outcome.finish_reason == "stop" and outcome.error is None
    assert outcome.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert outcome.ttft_s is not None and 0 <= outcome.ttft_s <= outcome.duration_s


async def test_a_stream_whose_client_did_not_ask_for_usage_is_relayed_without_it() -> None:
    """The gateway asks the backend for usage (it learns speeds from token counts) and drops the
    usage event, keeping whatever else the client put in stream_options."""
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append) as (url, (upstream,), client):
        status, body, _ = await post(
            client, url, chat(True) | {"stream_options": {"continuous_usage_stats": False}})
        assert status == 200
        assert body == STREAM_WITHOUT_USAGE
        assert upstream.bodies[0]["stream_options"] == {"continuous_usage_stats": False,
                                                        "include_usage": True}
        await inflight_returns_to_zero(client, url)
    (outcome,) = outcomes
    assert outcome.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


async def test_with_stream_usage_off_the_client_bytes_go_upstream_unchanged() -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append, stream_usage=False) as (
            url, (upstream,), client):
        status, body, _ = await post(client, url, chat(True))
        assert status == 200
        assert body == STREAM_WITHOUT_USAGE
        assert upstream.bodies == [chat(True)]
        await inflight_returns_to_zero(client, url)
    (outcome,) = outcomes
    assert outcome.usage is None


async def test_a_mid_stream_failure_is_recorded_as_an_error() -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(1, on_done=outcomes.append) as (url, (upstream,), client):
        upstream.mode = "die_mid_stream"
        await post(client, url, chat(True))
        await inflight_returns_to_zero(client, url)
    (outcome,) = outcomes
    assert outcome.error is not None and "mid-stream" in outcome.error
    assert outcome.finish_reason is None
