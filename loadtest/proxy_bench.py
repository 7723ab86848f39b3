"""What the gateway adds to a streamed request, measured on loopback.

    python -m loadtest.proxy_bench [--requests 300] [--chunks 100] [--concurrency 1]

The same streamed chat requests go straight to a fast upstream (it writes `--chunks` SSE content
events, then finish, usage if asked for, and [DONE], as fast as it can) and then through the
gateway. Upstream, gateway and client share this process and one uvloop loop, so the difference
between the two runs is the gateway's own CPU time: per request and per relayed chunk. The client
does not ask for usage, so the gateway's run includes asking the upstream for it and dropping the
usage event. Loopback only; the run is bounded by --requests.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

import aiohttp
import orjson
import uvloop
from aiohttp import web

from gateway.config import Settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway

MODEL = "bench"
MAX_REQUESTS = 100_000


def _event(content: str, finish: str | None = None) -> bytes:
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None,
                     "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _stream(chunks: int) -> list[bytes]:
    usage = {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": 10 + chunks}
    return [
        _event(""),
        *(_event(" tok") for _ in range(chunks)),
        _event("", "stop"),
        b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n",
        b"data: [DONE]\n\n",
    ]


async def _upstream(events: Sequence[bytes]) -> tuple[web.AppRunner, str]:
    """As vLLM does, the usage event is sent only when `stream_options.include_usage` asks."""
    events_without_usage = [e for e in events if b'"usage"' not in e]

    async def complete(request: web.Request) -> web.StreamResponse:
        options = orjson.loads(await request.read()).get("stream_options") or {}
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events if options.get("include_usage") else events_without_usage:
            await response.write(event)
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def _run(http: aiohttp.ClientSession, base: str, requests: int, concurrency: int,
               expected: int) -> float:
    """Seconds to complete `requests` streamed requests, `concurrency` at a time."""
    body = orjson.dumps({"model": MODEL, "stream": True,
                         "messages": [{"role": "user", "content": "bench"}]})
    headers = {"Content-Type": "application/json"}
    todo = iter(range(requests))

    async def worker() -> None:
        for _ in todo:
            async with http.post(base + "/v1/chat/completions", data=body,
                                 headers=headers) as resp:
                size = 0
                async for chunk in resp.content.iter_any():
                    size += len(chunk)
            if resp.status != 200 or size != expected:
                raise RuntimeError(f"bad answer from {base}: HTTP {resp.status}, {size} bytes")

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


def _drop(outcome: Outcome) -> None:
    """No access log during the measurement."""


async def bench(requests: int, chunks: int, concurrency: int) -> None:
    events = _stream(chunks)
    # The client does not ask for usage; the gateway does, and drops the usage event it relays.
    expected = sum(len(e) for e in events if b'"usage"' not in e)
    runner, upstream = await _upstream(events)
    try:
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": upstream, "models": [MODEL]}],
            "routing": {"poll_interval_s": 3600},  # the fake upstream has no /metrics
        })
        async with running_gateway(settings, on_done=_drop) as gateway, \
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            warmup = min(requests, 20)
            await _run(http, upstream, warmup, concurrency, expected)
            await _run(http, gateway, warmup, concurrency, expected)
            direct = await _run(http, upstream, requests, concurrency, expected)
            proxied = await _run(http, gateway, requests, concurrency, expected)
    finally:
        await runner.cleanup()
    relayed = requests * len(events)
    print(f"{requests} streamed requests x {len(events)} SSE events, concurrency {concurrency}, "
          f"one process on loopback")
    for name, seconds in (("direct", direct), ("gateway", proxied)):
        print(f"  {name:8} {seconds:7.3f} s  {requests / seconds:9.1f} req/s  "
              f"{relayed / seconds:11.0f} events/s")
    extra = proxied - direct
    print(f"  overhead {extra / requests * 1e3:7.3f} ms per request, "
          f"{extra / relayed * 1e6:6.2f} us per event (gateway CPU, incl. its two HTTP hops)")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.proxy_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=100, help="content events per stream")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be in 1..{MAX_REQUESTS}")
    if args.chunks < 1 or args.concurrency < 1:
        parser.error("--chunks and --concurrency must be >= 1")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(bench(args.requests, args.chunks, args.concurrency))


if __name__ == "__main__":
    main()
