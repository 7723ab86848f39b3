"""A loopback backend that misbehaves on command, and a gateway in front of a few of them.

`FaultyUpstream.mode` says how it answers the next completion requests:
- ok: a whole answer, or a good stream;
- hang: never sends its headers;
- status: answers `status` with `error_body` and `error_headers`;
- stall: sends the first two events of the stream, then nothing;
- flood: streams content events without end (for a client that stops reading);
- hold: waits for `release` to be set, then answers as its mode is then (ok if still hold).
It records what it received (`calls`, `headers`, the paths asked), and `closed`: the requests
whose connection the gateway closed while the handler still ran (aiohttp cancels it).
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.config import Settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway
from tests.paths import FIXTURES

MODEL = "m"


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` served on a free 127.0.0.1 port (handlers cancelled when their client leaves):
    its runner, to clean up, and its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def chunk(content: str, finish: str | None = None) -> bytes:
    delta = {"content": content}
    event = {"object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


GOOD_STREAM = [chunk(""), chunk("Hello"), chunk(" there"), chunk("!", "stop"),
               b"data: [DONE]\n\n"]
GOOD_JSON = {"object": "chat.completion", "model": MODEL, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hello there!"},
     "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                          "total_tokens": 8}}
FLOOD_EVENT = chunk("x" * 16_000)


class FaultyUpstream:
    def __init__(self) -> None:
        self.mode = "ok"
        self.status = 200
        self.error_body = b""
        self.error_headers: dict[str, str] = {}
        self.release = asyncio.Event()
        self.calls = 0
        self.closed = 0  # completion handlers cancelled: the gateway closed the connection
        self.headers: list[dict[str, str]] = []  # of every request, scrapes included
        self.paths: list[str] = []
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
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with warnings.catch_warnings():  # the server side of connections cut while stopping
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()

    def _seen(self, request: web.Request) -> None:
        self.headers.append(dict(request.headers))
        self.paths.append(request.path)

    async def _models(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.Response(body=(FIXTURES / "vllm-v1.prom").read_bytes(),
                            content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        self.calls += 1
        body = orjson.loads(await request.read())
        try:
            return await self._answer(request, body)
        except asyncio.CancelledError:
            self.closed += 1
            raise

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.mode == "hold":  # then answers as the mode says by the time it is released
            await self.release.wait()
        if self.mode == "hang":
            await asyncio.Event().wait()
        if self.mode == "status":
            return web.Response(status=self.status, body=self.error_body,
                                headers=self.error_headers)
        if not body.get("stream"):
            return web.json_response(GOOD_JSON)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.mode == "flood":
            while True:
                await response.write(FLOOD_EVENT)
        events = GOOD_STREAM[:2] if self.mode == "stall" else GOOD_STREAM
        for event in events:
            await response.write(event)
        if self.mode == "stall":
            await asyncio.Event().wait()
        await response.write_eof()
        return response


@asynccontextmanager
async def gateway_over(
    count: int, on_done: Callable[[Outcome], None] | None = None,
    backends: list[dict[str, Any]] | None = None, **server: Any
) -> AsyncIterator[tuple[str, list[FaultyUpstream], aiohttp.ClientSession]]:
    """A gateway (round robin, no scrape during the test) over `count` faulty upstreams;
    `backends` adds fields to each one's entry."""
    async with AsyncExitStack() as stack:
        upstreams = [FaultyUpstream() for _ in range(count)]
        for upstream in upstreams:
            await upstream.start()
            stack.push_async_callback(upstream.stop)
        extra = backends or [{} for _ in upstreams]
        settings = Settings.model_validate({
            "server": {"port": 0, **server},
            "routing": {"poll_interval_s": 60, "policy": "round_robin"},
            "backends": [{"url": u.url, "id": f"u{i}", **fields}
                         for i, (u, fields) in enumerate(zip(upstreams, extra, strict=True))],
        })
        url = await stack.enter_async_context(running_gateway(settings, on_done=on_done))
        client = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, upstreams, client


def chat(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


async def post(client: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    async with client.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.read(), dict(resp.headers)


def events_of(raw: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]


async def admin_rows(client: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with client.get(url + "/admin/backends") as resp:
        rows: list[dict[str, Any]] = (await resp.json(loads=orjson.loads))["backends"]
        return rows


async def no_inflight(client: aiohttp.ClientSession, url: str) -> bool:
    return all(row["inflight"] == 0 for row in await admin_rows(client, url))


async def metric_lines(client: aiohttp.ClientSession, url: str, name: str) -> dict[str, float]:
    """The samples of one metric family on /metrics, by their label text."""
    async with client.get(url + "/metrics") as resp:
        text = await resp.text()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            key, _, value = line.rpartition(" ")
            samples[key[len(name):]] = float(value)
    return samples
