"""The processes of `loadtest.bench_overhead`, each run as `python -m loadtest.bench_overhead_procs
ROLE ...`, so that each has its own CPU clock:

- `mock --port P`: a fixed-timing streaming backend with vLLM-format `/metrics`, `/health` and
  `/v1/models`. A request's last message says what to send: `tokens=N pace_ms=P` (defaults 16
  and 0). A stream is the role event, N content events P ms apart, the finish event, the usage
  event when `stream_options.include_usage` asks for it, and `[DONE]`; each content event's text
  is `@<ns>`, the `time.monotonic_ns()` it was written at, so a client on the same machine knows
  how long each token took to reach it. A whole answer comes at once.
- `relay --port P --upstream URL`: the bare aiohttp relay the gateway is measured against: it
  posts the body on and copies the answer back chunk by chunk, nothing else.
- `load --url URL --mode json|stream --concurrency C --requests N [--tokens T --pace-ms P]`:
  the load generator; prints one JSON line: wall seconds, requests done and failed, TTFTs (or
  latencies) and the per-token delays (seconds, sorted samples), content events delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web

MODEL = "bench"
# Every request carries it: LiteLLM's proxy refuses to start without a master key; the other
# paths ignore it.
BENCH_KEY = "sk-kvgate-bench-0123456789abcdef"
_ASK = re.compile(rb"tokens=(\d+) pace_ms=(\d+(?:\.\d+)?)")
_STAMP = re.compile(rb'"content": ?"@(\d+)"')
METRICS = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000000"} 1.0\n'
).encode()


def _event(content: str, finish: str | None = None) -> bytes:
    payload = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
               "model": MODEL, "choices": [{"index": 0, "delta": {"content": content},
                                            "logprobs": None, "finish_reason": finish}]}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _asked(body: dict[str, Any]) -> tuple[int, float]:
    messages = body.get("messages") or [{}]
    text = str(messages[-1].get("content", "")).encode()
    found = _ASK.search(text)
    return (int(found[1]), float(found[2]) / 1000) if found else (16, 0.0)


async def _complete(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    tokens, pace = _asked(body)
    usage = {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens}
    if not body.get("stream"):
        return web.Response(content_type="application/json", body=orjson.dumps({
            "id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * tokens},
                         "finish_reason": "stop"}], "usage": usage}))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_event(""))
    for _ in range(tokens):
        if pace:
            await asyncio.sleep(pace)
        await response.write(_event(f"@{time.monotonic_ns()}"))
    await response.write(_event("", "stop"))
    if (body.get("stream_options") or {}).get("include_usage"):
        await response.write(b"data: " + orjson.dumps(
            {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0,
             "model": MODEL, "choices": [], "usage": usage}) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def mock_app() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=METRICS, content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", _complete)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


def relay_app(upstream: str) -> web.Application:
    session: dict[str, aiohttp.ClientSession] = {}

    async def start(app: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def stop(app: web.Application) -> None:
        await session["s"].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with session["s"].post(upstream + request.path, data=body,
                                     headers={"Content-Type": "application/json"}) as up:
            response = web.StreamResponse(status=up.status, headers={
                "Content-Type": up.headers.get("Content-Type", "application/json")})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_get("/v1/models", models)
    return app


async def _serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    await asyncio.Event().wait()


async def load(url: str, mode: str, concurrency: int, requests: int, tokens: int,
               pace_ms: float) -> dict[str, Any]:
    stream = mode == "stream"
    latencies: list[float] = []
    delays: list[float] = []
    events = failed = 0
    failures: dict[str, int] = {}  # status or exception name: how many
    todo = iter(range(requests))
    ask = f"tokens={tokens} pace_ms={pace_ms:g}"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {BENCH_KEY}"}

    async def worker(http: aiohttp.ClientSession) -> None:
        nonlocal events, failed
        for _ in todo:
            body = orjson.dumps({"model": MODEL, "stream": stream, "max_tokens": tokens,
                                 "temperature": 0,
                                 "messages": [{"role": "user", "content": f"{_nonce()} {ask}"}]})
            start = time.monotonic()
            first: float | None = None
            try:
                async with http.post(url + "/v1/chat/completions", data=body,
                                     headers=headers) as resp:
                    if not stream:
                        await resp.read()
                        first = time.monotonic()
                    else:
                        async for data in resp.content.iter_any():
                            stamps = _STAMP.findall(data)
                            if stamps:
                                now = time.monotonic_ns()
                                if first is None:
                                    first = now / 1e9
                                events += len(stamps)
                                delays.extend((now - int(s)) / 1e9 for s in stamps)
                    ok = resp.status == 200
                    status = str(resp.status)
            except aiohttp.ClientError as exc:
                ok, status = False, type(exc).__name__
            if not ok:
                failures[status] = failures.get(status, 0) + 1
            if not ok or first is None:
                failed += 1
            else:
                latencies.append(first - start)

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        began = time.monotonic()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        wall = time.monotonic() - began
    return {"wall_s": wall, "done": len(latencies), "failed": failed,
            "latencies": _sample(latencies), "delays": _sample(delays), "events": events,
            "failures": failures}


def _nonce() -> str:
    """A prompt of its own per request: with the cache on, every request misses (exactly and
    semantically: random words share no n-grams to speak of)."""
    return " ".join(os.urandom(6).hex() for _ in range(4))


def _sample(values: list[float], most: int = 20_000) -> list[float]:
    """Sorted, thinned evenly to at most `most` values (its percentiles stay)."""
    values.sort()
    if len(values) <= most:
        return values
    step = len(values) / most
    return [values[int(i * step)] for i in range(most)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_overhead_procs")
    parser.add_argument("role", choices=("mock", "relay", "load"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", default="")
    parser.add_argument("--url", default="")
    parser.add_argument("--mode", choices=("json", "stream"), default="stream")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--pace-ms", type=float, default=0.0)
    parser.add_argument("--out", type=Path, help="load: where the figures go (JSON)")
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if args.role == "mock":
            runner.run(_serve(mock_app(), args.port))
        elif args.role == "relay":
            runner.run(_serve(relay_app(args.upstream), args.port))
        else:
            result = runner.run(load(args.url, args.mode, args.concurrency, args.requests,
                                     args.tokens, args.pace_ms))
            args.out.write_bytes(orjson.dumps(result))


if __name__ == "__main__":
    main()
