"""Token coalescing on loopback: with a flush interval, a paced stream reaches the client in a
few writes per interval, its first content event at once, its bytes, its end and its usage as
without coalescing; a silent backend, a backend that resets and a client that hangs up are
handled as ever, and a coalesced connection goes back to the pool able to read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.config import Settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway
from tests.upstreams import MODEL, chunk, events_of, no_inflight, serve_on_loopback
from tests.waiting import until

TOKENS = 40
PACE_S = 0.005  # between two content events: 200 tokens/s
USAGE = {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 3 + TOKENS}


@dataclass
class Paced:
    """Streams TOKENS content events PACE_S apart, then finish, usage (when asked) and [DONE].
    mode "stall" stops after `cut` tokens and sends nothing more; "reset" aborts the
    connection there; "hold" waits for `release` after the first token."""

    mode: str = "ok"
    cut: int = 5
    release: asyncio.Event = field(default_factory=asyncio.Event)
    first_sent_at: float | None = None
    closed: int = 0

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            await response.write(chunk(""))
            for i in range(TOKENS):
                if i == self.cut and self.mode == "stall":
                    await asyncio.Event().wait()
                if i == self.cut and self.mode == "reset":
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                await response.write(chunk(f"t{i} "))
                if i == 0:
                    self.first_sent_at = time.monotonic()
                    if self.mode == "hold":
                        await self.release.wait()
                await asyncio.sleep(PACE_S)
            await response.write(chunk("", "stop"))
            if usage:
                await response.write(b"data: " + orjson.dumps(
                    {"object": "chat.completion.chunk", "model": MODEL, "choices": [],
                     "usage": USAGE}) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except asyncio.CancelledError:
            self.closed += 1
            raise
        return response

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})


@dataclass
class Rig:
    url: str
    upstream: Paced
    http: aiohttp.ClientSession
    outcomes: list[Outcome]


@asynccontextmanager
async def rig(flush_ms: int, **server: Any) -> AsyncIterator[Rig]:
    upstream = Paced()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.complete)
    app.router.add_get("/v1/models", upstream.models)
    runner, base = await serve_on_loopback(app)
    outcomes: list[Outcome] = []
    settings = Settings.model_validate({
        "server": {"port": 0, "stream_flush_interval_ms": flush_ms, **server},
        "routing": {"poll_interval_s": 60},
        "backends": [{"url": base, "id": "b0", "models": [MODEL]}],
    })
    try:
        async with running_gateway(settings, on_done=outcomes.append) as url, \
                aiohttp.ClientSession() as http:
            yield Rig(url, upstream, http, outcomes)
    finally:
        await runner.cleanup()


BODY = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def streamed(r: Rig, body: dict[str, Any] = BODY) -> tuple[bytes, int, float]:
    """The stream's bytes, how many reads they came in, and its seconds."""
    start = time.monotonic()
    raw, reads = b"", 0
    async with r.http.post(r.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for data in resp.content.iter_any():
            raw += data
            reads += 1
    return raw, reads, time.monotonic() - start


async def test_a_coalesced_stream_arrives_whole_in_a_few_writes_per_interval() -> None:
    async with rig(0) as plain:
        expected, _, _ = await streamed(plain)
    interval_s = 0.1
    async with rig(100) as r:
        raw, reads, seconds = await streamed(r)
        await until(lambda: len(r.outcomes) == 1, "the stream recorded")
    assert raw == expected  # the same bytes: usage asked for upstream and dropped, [DONE]
    assert events_of(raw)[-1] == b"[DONE]"
    assert b'"usage"' not in raw
    # The role event and the first token, then at most one write per tick, then the end
    # (against one read per event, TOKENS of them 5 ms apart, without coalescing).
    assert reads <= seconds / interval_s + 4
    assert r.outcomes[0].usage == USAGE


async def test_usage_the_client_asked_for_is_relayed_and_counted() -> None:
    async with rig(50) as r:
        body = {**BODY, "stream_options": {"include_usage": True}}
        raw, _, _ = await streamed(r, body)
        await until(lambda: len(r.outcomes) == 1, "the stream recorded")
    usage_events = [orjson.loads(e) for e in events_of(raw) if b'"usage"' in e]
    assert [e["usage"] for e in usage_events] == [USAGE]
    assert r.outcomes[0].usage == USAGE
    assert r.outcomes[0].error is None


async def test_the_first_content_event_is_sent_at_once() -> None:
    async with rig(1000) as r:
        r.upstream.mode = "hold"
        async with r.http.post(r.url + "/v1/chat/completions", json=BODY) as resp:
            async for line in resp.content:
                if b'"content":"t0 "' in line:
                    break
            got_at = time.monotonic()
            r.upstream.release.set()
            rest = await resp.read()
        assert r.upstream.first_sent_at is not None
        # Held back by a tick it would wait for up to the whole 1 s interval.
        assert got_at - r.upstream.first_sent_at < 0.5
        assert events_of(rest)[-1] == b"[DONE]"


async def test_a_silent_backend_is_cut_at_the_idle_timeout() -> None:
    async with rig(50, stream_idle_timeout_s=0.3) as r:
        r.upstream.mode = "stall"
        raw, _, _ = await streamed(r)
        await until(lambda: len(r.outcomes) == 1, "the stream recorded")
    events = events_of(raw)
    assert events[-1] == b"[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert error["code"] == "upstream_stream_idle"
    assert b'"content":"t4 "' in raw  # what came before the silence was relayed


async def test_a_backend_that_resets_mid_stream_ends_it_with_an_error_event() -> None:
    async with rig(50) as r:
        r.upstream.mode = "reset"
        raw, _, _ = await streamed(r)
        await until(lambda: len(r.outcomes) == 1, "the stream recorded")
    events = events_of(raw)
    assert events[-1] == b"[DONE]"
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_stream_failed"
    assert r.outcomes[0].error is not None


async def test_a_client_that_hangs_up_aborts_the_backend() -> None:
    async with rig(50) as r:
        r.upstream.mode = "hold"
        async with r.http.post(r.url + "/v1/chat/completions", json=BODY) as resp:
            async for line in resp.content:
                if b'"content":"t0 "' in line:
                    break
            resp.close()  # hang up mid-stream
        r.upstream.release.set()
        await until(lambda: r.upstream.closed == 1, "the backend's handler cancelled")
        await until(lambda: no_inflight(r.http, r.url), "no request in flight")


async def test_a_coalesced_connection_goes_back_to_the_pool_reading() -> None:
    async with rig(20, first_byte_timeout_s=5) as r:
        for _ in range(3):  # each stream after the first may reuse the pooled connection
            raw, _, _ = await streamed(r)
            assert events_of(raw)[-1] == b"[DONE]"
        await until(lambda: len(r.outcomes) == 3, "the streams recorded")
    assert all(o.error is None and o.usage == USAGE for o in r.outcomes)
