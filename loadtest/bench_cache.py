"""The response cache's benchmark: the work it takes off the backends, what a hit costs, and
whether a semantic hit ever answers another question.

    python -m loadtest.bench_cache [--requests 400] [--questions 100] [--paraphrase-share 0.3]
        [--zipf 1.1] [--concurrency 8] [--max-tokens 48] [--backends 2] [--time-scale 1]
        [--stores off,memory,redis] [--seed 0] [--lookups 2000] [--json FILE] [--no-record]
        [--search-sizes 10000,50000] [--search-lookups 300] [--embed-runs 30]
        [--exact-lookups 1000] [--cpu-rounds 5] [--cpu-requests 90] [--no-targets]

Part 1, live: `kvgate serve` in front of --backends simulators, in this process on loopback, gets
the same --requests streamed chats once per store (`off` is the cache turned off), --concurrency
at a time. Each request asks one of --questions distinct questions, chosen by a Zipf law of
exponent --zipf (a few questions are popular, most are rare, as in real traffic); a
--paraphrase-share of them is reworded (case, contractions, punctuation, spacing, a polite
opening), which only the semantic tier can match. Reported per store: hits by tier, requests and
tokens the backends served, TTFT (request sent → first content event) of hits and misses, and
false hits: a semantic hit whose answer was first written for another question (the simulator's
text is keyed by the prompt, so an answer's text names the question it was written for).

Part 2, in-process: the cost of one lookup (exact hit, semantic hit, miss) against a store
holding --lookups entries, per store, with the built-in embedder.

Part 3, the semantic tier's targets, on one core (loadtest/cache_costs.py, cache_cpu.py):
semantic search p99 at most 2 ms among 10,000 entries of one namespace and 10 ms among 50,000,
beyond the embedding (the local model's own cost per prompt of 8, 50 and 200 words beside it);
an exact hit's p99 at most 1 ms over a loopback redis-server; with the hashing embedder, the
gateway's CPU per request on a miss with the semantic tier on at most 1.3 times that with it
off (two `kvgate serve` processes side by side, rounds interleaved, CPU from /proc). Printed
against the targets; `--no-targets` skips the part.

Redis runs are skipped, with a note, when `redis-server` is not installed; the server is started
on a free loopback port and stopped by this script. The tables go to
`loadtest/results/bench_cache.json` (`--no-record`: nowhere); `--json` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.cache_costs import lookup_costs, measure_targets
from loadtest.redis_server import redis_available, running_redis
from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

STORES = ("off", "memory", "redis")
SUBJECTS = (
    "France", "Spain", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Egypt", "Chile", "India",
    "Peru", "Italy", "Greece", "Mexico", "Vietnam", "Ghana", "Poland", "Turkey", "Nepal", "Cuba",
)
TEMPLATES = (
    "What is the capital of {}?",
    "What language do people speak in {}?",
    "What is the currency of {}?",
    "What is the population of {}?",
    "What is a traditional dish from {}?",
    "When did {} become independent?",
)


@dataclass(frozen=True, slots=True)
class Ask:
    question: int  # which of the distinct questions
    text: str  # as sent: the question or a rewording of it


@dataclass(frozen=True, slots=True)
class Reply:
    ask: Ask
    status: int
    cache: str  # x-kvgate-cache
    ttft_s: float | None
    text: str
    prompt_tokens: int
    completion_tokens: int


def questions(count: int) -> list[str]:
    pool = [template.format(subject) for template in TEMPLATES for subject in SUBJECTS]
    if count > len(pool):
        raise ValueError(f"at most {len(pool)} distinct questions")
    return pool[:count]


def reword(text: str, rng: random.Random) -> str:
    """A near-duplicate of `text`: the same question as another person would type it."""
    out = text
    if rng.random() < 0.5:
        out = out.lower()
    if rng.random() < 0.5:
        out = out.replace("What is", "What's").replace("what is", "what's")
    if rng.random() < 0.5:
        out = out.rstrip("?") + rng.choice(["", " ?", "??", "."])
    if rng.random() < 0.3:
        out = "Please tell me: " + out
    if out == text:
        out = "  " + text.lower() + "  "
    return out


def plan(args: argparse.Namespace) -> list[Ask]:
    rng = random.Random(args.seed)
    pool = questions(args.questions)
    weights = [1.0 / (rank + 1) ** args.zipf for rank in range(len(pool))]
    asks = []
    for question in rng.choices(range(len(pool)), weights=weights, k=args.requests):
        text = pool[question]
        if rng.random() < args.paraphrase_share:
            text = reword(text, rng)
        asks.append(Ask(question, text))
    return asks


async def ask(http: aiohttp.ClientSession, gateway: str, model: str, item: Ask,
              max_tokens: int) -> Reply:
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "Answer in one short paragraph."},
                         {"role": "user", "content": item.text}]}
    start = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    async with http.post(gateway + "/v1/chat/completions", json=body) as resp:
        cache = resp.headers.get("x-kvgate-cache", "-")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = orjson.loads(line[6:])
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    pieces.append(piece)
                    if first is None:
                        first = time.perf_counter()
            if event.get("usage"):
                usage = event["usage"]
        status = resp.status
    return Reply(item, status, cache, None if first is None else first - start, "".join(pieces),
                 int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))


SEMANTIC_ON = {"semantic": "on", "embedder": "hashing"}  # the tier under measure (off by default)


@asynccontextmanager
async def cache_settings(store: str) -> AsyncIterator[dict[str, Any]]:
    if store == "off":
        yield {"enabled": False}
    elif store == "memory":
        yield {"enabled": True, **SEMANTIC_ON}
    else:
        async with running_redis() as url:
            yield {"enabled": True, "store": "redis", "redis_url": url, **SEMANTIC_ON}


async def live(args: argparse.Namespace, store: str, asks: Sequence[Ask]) -> list[Reply]:
    model = PRESETS[DEFAULT_PRESET].model_name
    async with AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(
                    running_sim(preset=DEFAULT_PRESET, time_scale=args.time_scale, seed=i))
                for i in range(args.backends)]
        cache = await stack.enter_async_context(cache_settings(store))
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": url, "id": f"sim{i}"} for i, url in enumerate(urls)],
            "routing": {"poll_interval_s": 0.05},
            "cache": cache,
        })
        gateway = await stack.enter_async_context(running_gateway(settings, on_done=_quiet))
        http = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        replies: list[Reply | None] = [None] * len(asks)
        todo = iter(range(len(asks)))

        async def worker() -> None:
            for i in todo:
                replies[i] = await ask(http, gateway, model, asks[i], args.max_tokens)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return [r for r in replies if r is not None]


def summarise(replies: Sequence[Reply]) -> dict[str, Any]:
    served = [r for r in replies if r.cache not in ("exact", "semantic")]
    hits = [r for r in replies if r.cache in ("exact", "semantic")]
    origin = {r.text: r.ask.question for r in served if r.text}
    false_hits = sum(1 for r in hits if r.cache == "semantic"
                     and origin.get(r.text, r.ask.question) != r.ask.question)
    return {
        "requests": len(replies),
        "failed": sum(r.status != 200 for r in replies),
        "exact": sum(r.cache == "exact" for r in replies),
        "semantic": sum(r.cache == "semantic" for r in replies),
        "false_hits": false_hits,
        "backend_requests": len(served),
        "backend_tokens": sum(r.prompt_tokens + r.completion_tokens for r in served),
        "ttft_p50_ms": _ms(statistics.median, replies),
        "ttft_p99_ms": _ms(lambda v: _pct(v, 0.99), replies),
        "hit_ttft_p50_ms": _ms(statistics.median, hits),
        "miss_ttft_p50_ms": _ms(statistics.median, served),
    }


def _ms(stat: Any, replies: Sequence[Reply]) -> float | None:
    values = [r.ttft_s * 1e3 for r in replies if r.ttft_s is not None]
    return round(stat(values), 2) if values else None


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _quiet(outcome: object) -> None:
    """No access log."""


def _row(name: str, s: dict[str, Any]) -> str:
    hit = s["exact"] + s["semantic"]
    return (f"{name:7} {s['requests']:5} {s['failed']:4} {s['exact']:6} {s['semantic']:6}"
            f" {hit / max(1, s['requests']):6.1%} {s['false_hits']:5} {s['backend_requests']:6}"
            f" {s['backend_tokens']:8} {_f(s['ttft_p50_ms'])} {_f(s['ttft_p99_ms'])}"
            f" {_f(s['hit_ttft_p50_ms'])} {_f(s['miss_ttft_p50_ms'])}")


def tables(args: argparse.Namespace, live_results: dict[str, dict[str, Any]],
           costs: dict[str, dict[str, float]]) -> list[Table]:
    base = live_results.get("off")
    rows = []
    for store, s in live_results.items():
        tokens = (None if base is None or store == "off"
                  else round(s["backend_tokens"] / max(1, base["backend_tokens"]), 2))
        rows.append([store, s["requests"], s["failed"], s["exact"], s["semantic"],
                     s["false_hits"], s["backend_requests"], s["backend_tokens"], tokens,
                     s["ttft_p50_ms"], s["ttft_p99_ms"], s["hit_ttft_p50_ms"],
                     s["miss_ttft_p50_ms"]])
    out = [Table("Live, one run per store (TTFT in ms)",
                 ["store", "requests", "failed", "exact hits", "semantic hits", "false hits",
                  "backend requests", "backend tokens", "tokens vs off", "TTFT p50", "TTFT p99",
                  "hit TTFT p50", "miss TTFT p50"], rows,
                 "A false hit is a semantic hit answered with text first written for another "
                 "question.")]
    if costs:
        kinds = list(next(iter(costs.values())))
        out.append(Table(f"Lookup cost against {args.lookups} entries (µs per lookup, "
                         "in-process)", ["store", *kinds],
                         [[store, *(c[k] for k in kinds)] for store, c in costs.items()]))
    return out


def _f(value: float | None) -> str:
    return f"{'-':>8}" if value is None else f"{value:8.1f}"


async def run(args: argparse.Namespace) -> int:
    stores = [s for s in args.stores if s != "redis" or redis_available()]
    if len(stores) < len(args.stores):
        print("redis-server is not installed: the redis runs are skipped")
    asks = plan(args)
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()
                                          if k not in ("json", "results_dir")}}
    print(f"{args.requests} streamed chats, {args.concurrency} at a time, over {args.questions}"
          f" questions (Zipf {args.zipf}), {args.paraphrase_share:.0%} reworded; "
          f"{args.backends} x {DEFAULT_PRESET} at time scale {args.time_scale:g}")
    print("store   reqs fail  exact   sem.   hits false backend   tokens TTFTp50  TTFTp99"
          "  hit p50 miss p50   (ms)")
    live_results: dict[str, dict[str, Any]] = {}
    for store in stores:
        live_results[store] = summarise(await live(args, store, asks))
        print(_row(store, live_results[store]), flush=True)
    results["live"] = live_results
    if "off" in live_results:
        base = live_results["off"]
        for store, s in live_results.items():
            if store == "off":
                continue
            tokens = s["backend_tokens"] / max(1, base["backend_tokens"])
            ttft = (s["ttft_p50_ms"] or 0) / (base["ttft_p50_ms"] or 1)
            print(f"{store}: backend tokens {tokens:.2f}x the cache off's, TTFT p50 {ttft:.2f}x")
    print(f"\nlookup cost against {args.lookups} entries (µs per lookup, in-process):")
    costs: dict[str, dict[str, float]] = {}
    for store in (s for s in stores if s != "off"):
        costs[store] = await lookup_costs(store, args.lookups)
        print(f"  {store:7} " + ", ".join(f"{k} {v:.0f}" for k, v in costs[store].items()))
    results["lookup_us"] = costs
    target_tables: list[Table] = []
    if args.targets:
        results["targets"], target_tables = await measure_targets(args)
        for table in target_tables:
            print(f"\n{table.title}\n  " + "\n  ".join(
                " | ".join(map(str, row)) for row in table.rows))
    if args.json:
        with open(args.json, "wb") as out:
            out.write(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    failed = sum(s["failed"] for s in live_results.values())
    false_hits = sum(s["false_hits"] for s in live_results.values())
    if failed or false_hits:
        print(f"FAILED: {failed} requests failed, {false_hits} false hits (nothing recorded)")
        return 1
    save(args, "bench_cache", title="Response cache: work off the backends, cost of a lookup",
         command=args.command, tables=[*tables(args, live_results, costs), *target_tables],
         notes=f"{args.requests} streamed chats, {args.concurrency} at a time, over "
               f"{args.questions} questions (Zipf {args.zipf:g}), {args.paraphrase_share:.0%} "
               f"reworded; {args.backends} x {DEFAULT_PRESET} simulators at time scale "
               f"{args.time_scale:g}, gateway, client and simulators in one process. Hits and "
               "backend tokens repeat from run to run; the TTFTs follow the host's load.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_cache",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--paraphrase-share", type=float, default=0.3)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--backends", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--stores", type=lambda s: s.split(","), default=list(STORES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    parser.add_argument("--search-sizes", type=lambda s: [int(n) for n in s.split(",")],
                        default=[10_000, 50_000], help="namespace sizes searched")
    parser.add_argument("--search-lookups", type=int, default=300)
    parser.add_argument("--embed-runs", type=int, default=30)
    parser.add_argument("--exact-lookups", type=int, default=1000)
    parser.add_argument("--cpu-rounds", type=int, default=5)
    parser.add_argument("--cpu-requests", type=int, default=90)
    parser.add_argument("--no-targets", dest="targets", action="store_false")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.command = command("loadtest.bench_cache", sys.argv[1:] if argv is None else argv)
    bad = [s for s in args.stores if s not in STORES]
    if bad or not 1 <= args.requests <= 20_000 or args.concurrency < 1 or args.backends < 1:
        print(f"bad usage: stores {bad or 'ok'}; requests 1..20000, concurrency and backends"
              " >= 1", file=sys.stderr)
        return 2
    try:
        questions(args.questions)
    except ValueError as exc:
        print(f"--questions: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
