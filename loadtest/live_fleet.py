"""The gateway live, over HTTP, in front of a mixed fleet of simulators: where the requests went,
how fast each backend was learned to be, and the latencies the clients saw.

    python -m loadtest.live_fleet [--fleet llama-3-8b-h100,llama-3-8b-h100,llama-3-8b-l40s]
        [--requests 300] [--concurrency 12] [--long-share 0.15] [--long-words 1500]
        [--max-tokens 48] [--policy cost] [--offload on|off] [--skip 100] [--seed 1]

It starts one `kvgate sim` engine per --fleet preset and `kvgate serve` in front of them, in this
process, on loopback; then --requests streamed chats, --concurrency at a time, whose clients do
not ask for usage (as most do not). A --long-share of them carry --long-words words, the others 40
to 160. The first --skip requests are the warm-up, while the gateway learns the backends' speeds;
the placement and latency figures count the rest. Unlike `kvgate simulate`, this runs the real
proxy, scrapes and learning on wall-clock time, so two runs differ.

Exit code 0 when every request got 200, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
import orjson

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import PRESETS
from loadtest.streamed import streamed_chat
from routing.policies import POLICIES

MAX_REQUESTS = 5_000


@dataclass(frozen=True, slots=True)
class Reply:
    long: bool
    backend: str
    status: int
    ttft_s: float | None  # from the request to the first content event
    tpot_s: float | None  # over the content events that followed


async def _chat(http: aiohttp.ClientSession, gateway: str, model: str, words: int,
                max_tokens: int, tag: int, long: bool) -> Reply:
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{tag} " + "word " * words}]}
    got = await streamed_chat(http, gateway, body)
    return Reply(long, got.headers.get("x-kvgate-backend", "-"), got.status, got.ttft_s,
                 got.tpot_s)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _latency(replies: Sequence[Reply]) -> str:
    ttfts = [r.ttft_s * 1e3 for r in replies if r.ttft_s is not None]
    tpots = [r.tpot_s * 1e3 for r in replies if r.tpot_s is not None]
    if not ttfts or not tpots:
        return "no completed streams"
    return (f"TTFT p50 {statistics.median(ttfts):6.1f} p99 {_pct(ttfts, 0.99):6.1f} ms, "
            f"TPOT p50 {statistics.median(tpots):5.1f} p99 {_pct(tpots, 0.99):5.1f} ms")


async def run(args: argparse.Namespace) -> int:
    presets = args.fleet
    model = PRESETS[presets[0]].model_name
    rng = random.Random(args.seed)
    plan = [rng.random() < args.long_share for _ in range(args.requests)]
    words = [args.long_words if long else rng.randint(40, 160) for long in plan]
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(running_sim(preset=p, model=model, seed=i))
                for i, p in enumerate(presets)]
        ids = [f"b{i}-{p.removeprefix('llama-3-8b-')}" for i, p in enumerate(presets)]
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": u, "id": i} for u, i in zip(urls, ids, strict=True)],
            "routing": {"policy": args.policy, "poll_interval_s": 0.05,
                        "offload_long_prompts": args.offload == "on"},
        })
        gateway = await stack.enter_async_context(running_gateway(settings, on_done=_quiet))
        http = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        replies: list[Reply | None] = [None] * args.requests
        todo = iter(range(args.requests))

        async def worker() -> None:
            for i in todo:
                replies[i] = await _chat(http, gateway, model, words[i], args.max_tokens, i,
                                         plan[i])

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        async with http.get(gateway + "/admin/backends") as resp:
            rows = orjson.loads(await resp.read())["backends"]
    done = [r for r in replies if r is not None]
    failed = sum(r.status != 200 for r in done)
    counted = done[args.skip:]
    print(f"fleet {','.join(presets)}; policy {args.policy}, offload {args.offload}; "
          f"{args.requests} streamed requests, {args.concurrency} at a time, "
          f"{args.long_share:.0%} of {args.long_words} words; the last {len(counted)} counted")
    by_backend = Counter(r.backend for r in counted)
    long_by_backend = Counter(r.backend for r in counted if r.long)
    for row in rows:
        bid = row["id"]
        print(f"  {bid:12} {by_backend[bid]:4} requests, {long_by_backend[bid]:3} of "
              f"{sum(long_by_backend.values())} long; learned speed "
              f"{row['speed_scale']}x the reference over {row['speed_replies']} replies")
    print(f"  short prompts: {_latency([r for r in counted if not r.long])}")
    print(f"  long prompts:  {_latency([r for r in counted if r.long])}")
    print(f"  statuses: {dict(Counter(r.status for r in done))}")
    return 1 if failed else 0


def _quiet(outcome: object) -> None:
    """No access log."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.live_fleet",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", default="llama-3-8b-h100,llama-3-8b-h100,llama-3-8b-l40s",
                        help="comma-separated `kvgate sim` presets, one backend each")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--long-share", type=float, default=0.15)
    parser.add_argument("--long-words", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--policy", default="cost", choices=sorted(POLICIES))
    parser.add_argument("--offload", choices=("on", "off"), default="on")
    parser.add_argument("--skip", type=int, default=100, help="warm-up requests not counted")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.fleet = [p.strip() for p in args.fleet.split(",") if p.strip()]
    unknown = [p for p in args.fleet if p not in PRESETS]
    if not args.fleet or unknown:
        parser.error(f"unknown preset(s) {unknown or '(none given)'}; known: {sorted(PRESETS)}")
    if len({PRESETS[p].model_name for p in args.fleet}) != 1:
        parser.error("every --fleet preset must serve the same model")
    if not 1 <= args.requests <= MAX_REQUESTS or args.concurrency < 1:
        parser.error(f"--requests must be 1..{MAX_REQUESTS} and --concurrency at least 1")
    if not 0.0 <= args.long_share <= 1.0 or args.long_words < 1 or args.max_tokens < 1:
        parser.error("--long-share must be in [0, 1]; --long-words and --max-tokens at least 1")
    if not 0 <= args.skip < args.requests:
        parser.error("--skip must be below --requests")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
