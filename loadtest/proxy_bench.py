"""What the gateway adds to a streamed request, measured on loopback.

    python -m loadtest.proxy_bench [--requests 300] [--chunks 100] [--concurrency 1] [--cache]
        [--rounds 1] [--no-record]

The same streamed chat requests go straight to a fast upstream (it writes `--chunks` SSE content
events, then finish, usage if asked for, and [DONE], as fast as it can) and then through the
gateway. Upstream, gateway and client share this process and one uvloop loop, so the difference
between the two runs is the gateway's own CPU time: per request and per relayed chunk. The client
does not ask for usage, so the gateway's run includes asking the upstream for it and dropping the
usage event. With --cache a third run goes through a gateway whose response cache is on (in
memory) and never hits (every prompt differs): what looking a request up, collecting its streamed
answer and storing it cost. Loopback only; the run is bounded by --requests. The table goes to
`loadtest/results/proxy_bench.json` (`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack

import aiohttp
import orjson
import uvloop
from aiohttp import web

from gateway.config import Settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway
from loadtest.results import Table, add_arguments, command, save

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
               expected: int, tag: str) -> float:
    """Seconds to complete `requests` streamed requests, `concurrency` at a time."""
    headers = {"Content-Type": "application/json"}
    todo = iter(range(requests))

    async def worker() -> None:
        for i in todo:
            # A prompt of its own per request: with the cache on, every request misses.
            body = orjson.dumps({"model": MODEL, "stream": True,
                                 "messages": [{"role": "user", "content": f"bench {tag} {i}"}]})
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


async def bench(requests: int, chunks: int, concurrency: int, cache: bool = False,
                rounds: int = 1) -> Table:
    """Prints the runs and returns them as a table."""
    events = _stream(chunks)
    # The client does not ask for usage; the gateway does, and drops the usage event it relays.
    expected = sum(len(e) for e in events if b'"usage"' not in e)
    runner, upstream = await _upstream(events)
    runs: dict[str, float] = {}
    try:
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
            targets = {"direct": upstream}
            for name, cache_on in (("gateway", False), ("+cache", True))[:2 if cache else 1]:
                settings = Settings.model_validate({
                    "server": {"port": 0},
                    "backends": [{"url": upstream, "models": [MODEL]}],
                    "routing": {"poll_interval_s": 3600},  # the fake upstream has no /metrics
                    "cache": {"enabled": cache_on, "max_entries": 4 * requests * rounds},
                })
                targets[name] = await stack.enter_async_context(
                    running_gateway(settings, on_done=_drop))
            warmup = min(requests, 20)
            for base in targets.values():
                await _run(http, base, warmup, concurrency, expected, "warm-up")
            # Rounds alternate the targets and each keeps its best: a shared machine's noise
            # only ever adds time.
            for round_ in range(rounds):
                for name, base in targets.items():
                    seconds = await _run(http, base, requests, concurrency, expected,
                                         f"run {round_}")
                    runs[name] = min(runs.get(name, seconds), seconds)
    finally:
        await runner.cleanup()
    relayed = requests * len(events)
    print(f"{requests} streamed requests x {len(events)} SSE events, concurrency {concurrency}, "
          f"one process on loopback; best of {rounds} round{'s' if rounds > 1 else ''}")
    for name, seconds in runs.items():
        print(f"  {name:8} {seconds:7.3f} s  {requests / seconds:9.1f} req/s  "
              f"{relayed / seconds:11.0f} events/s")
    extra = runs["gateway"] - runs["direct"]
    print(f"  overhead {extra / requests * 1e3:7.3f} ms per request, "
          f"{extra / relayed * 1e6:6.2f} us per event (gateway CPU, incl. its two HTTP hops)")
    if cache:
        extra = runs["+cache"] - runs["gateway"]
        print(f"  the cache, every request a miss: {extra / requests * 1e3:7.3f} ms per request, "
              f"{extra / relayed * 1e6:6.2f} us per event more "
              f"({runs['+cache'] / runs['gateway']:.2f}x the gateway's time)")
    rows: list[list[object]] = []
    for name, seconds in runs.items():
        over = seconds - runs["direct"]
        rows.append([name, round(seconds, 3), round(requests / seconds, 1),
                     round(relayed / seconds), round(seconds / runs["direct"], 2),
                     None if name == "direct" else round(over / requests * 1e3, 3),
                     None if name == "direct" else round(over / relayed * 1e6, 2)])
    return Table(f"{requests} streamed requests x {len(events)} SSE events, concurrency "
                 f"{concurrency}, best of {rounds} alternating round{'s' if rounds > 1 else ''}",
                 ["path", "seconds", "requests/s", "events/s", "vs direct",
                  "added ms/request", "added µs/event"], rows,
                 "Upstream, gateway and client share one process and one uvloop loop, so the "
                 "time added over `direct` is the gateway's own CPU, its two HTTP hops included.")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.proxy_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=100, help="content events per stream")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate the runs this many times and keep each one's best")
    parser.add_argument("--cache", action="store_true",
                        help="also through a gateway with the response cache on, never hitting")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= MAX_REQUESTS:
        parser.error(f"--requests must be in 1..{MAX_REQUESTS}")
    if args.chunks < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--chunks, --concurrency and --rounds must be >= 1")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        table = runner.run(bench(args.requests, args.chunks, args.concurrency, args.cache,
                                 args.rounds))
    save(args, "proxy_bench", title="What the gateway adds to a streamed request",
         command=command("loadtest.proxy_bench", sys.argv[1:] if argv is None else argv),
         tables=[table])


if __name__ == "__main__":
    main()
