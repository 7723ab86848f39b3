"""Small-model routing's benchmark: what moving easy requests to a small model does for the
requests that need the large one.

    python -m loadtest.bench_small_model [--requests 300] [--rate 10] [--easy-share 0.7]
        [--large 1] [--small 1] [--large-blocks 512] [--time-scale 1] [--seed 0] [--json FILE]
        [--classifier auto|minilm|hashed] [--no-record]

`kvgate serve` in front of --large simulators of the large model (llama-3-8b on H100) and
--small of the small one (llama-3.2-1b on L40S), in this process on loopback, gets the same
--requests streamed chats three times. The large backends are short of KV (--large-blocks), as a
GPU is whose memory mostly holds a large model's weights: that is where batching stops being free
and moving easy requests away pays. Requests arrive at --rate a second (Poisson, open loop): all
named for the large model, then for the routing alias in mode `easy`, then in mode `overflow`.
An --easy-share of them are short questions asking for 64 tokens; the rest are hard (code to
write, "step by step"), asking for 256. Reported per run: the share the small model served, TTFT
and TPOT of the hard requests (which always need the large model) and of all, and the wall time.
The table goes to `loadtest/results/bench_small_model.json` (`--no-record`: nowhere). Exit code 1
if any request failed.

    python -m loadtest.bench_small_model --decision [--rounds 20] [--embed-rounds 2]

measures instead what the decision itself costs a request on one core (loadtest/
small_model_decision.py): the rules and the classifier's score, with the MiniLM embedding's own
cost beside them, into `loadtest/results/bench_small_model_decision.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, SMALL_PRESET
from loadtest.streamed import streamed_chat

LARGE = PRESETS[DEFAULT_PRESET].model_name
SMALL = PRESETS[SMALL_PRESET].model_name
RUNS = (("large only", LARGE, "easy"), ("auto, easy", "auto", "easy"),
        ("auto, overflow", "auto", "overflow"))
EASY = ("What is the capital of {}?", "Give me a synonym for '{}'.", "How do you say '{}' in "
        "French?", "Is {} a fruit or a vegetable?")
HARD = ("Write a Python function that parses {} dates, with tests, step by step.",
        "Explain step by step how to implement a {} cache with eviction, then the code.")
WORDS = ("tomato", "Peru", "quick", "banana", "Norway", "bright", "ISO", "LRU", "Kenya", "calm")


@dataclass(frozen=True, slots=True)
class Reply:
    hard: bool
    status: int
    model: str
    ttft_s: float | None
    tpot_s: float | None


def plan(requests: int, easy_share: float, seed: int) -> list[tuple[bool, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(requests):
        hard = rng.random() >= easy_share
        template = rng.choice(HARD if hard else EASY)
        out.append((hard, f"{template.format(rng.choice(WORDS))} (#{i})"))
    return out


async def chat(http: aiohttp.ClientSession, url: str, model: str, hard: bool, text: str
               ) -> Reply:
    body = {"model": model, "stream": True, "max_tokens": 256 if hard else 64,
            "ignore_eos": True, "messages": [{"role": "user", "content": text}]}
    got = await streamed_chat(http, url, body)
    return Reply(hard, got.status, got.headers.get("x-kvgate-model", "-"), got.ttft_s,
                 got.tpot_s)


async def run_once(args: argparse.Namespace, model: str, mode: str,
                   asks: Sequence[tuple[bool, str]]) -> tuple[list[Reply], float]:
    async with AsyncExitStack() as stack:
        backends = []
        for i in range(args.large):
            url = await stack.enter_async_context(
                running_sim(preset=DEFAULT_PRESET, time_scale=args.time_scale, seed=i,
                            num_gpu_blocks=args.large_blocks or None))
            backends.append({"id": f"large{i}", "url": url})
        for i in range(args.small):
            url = await stack.enter_async_context(
                running_sim(preset=SMALL_PRESET, time_scale=args.time_scale, seed=100 + i))
            backends.append({"id": f"small{i}", "url": url})
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": backends, "routing": {"poll_interval_s": 0.05},
            "small_model": [{"alias": "auto", "large": LARGE, "small": SMALL, "mode": mode,
                             "classifier": args.classifier}],
        })
        gateway = await stack.enter_async_context(running_gateway(settings, on_done=_quiet))
        http = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        # Open loop: request i leaves at its Poisson arrival time whatever the others are doing,
        # as users do (a closed loop would let fast easy answers pile hard requests up).
        rng = random.Random(args.seed)
        arrivals, at = [], 0.0
        for _ in asks:
            at += rng.expovariate(args.rate)
            arrivals.append(at)
        started = time.perf_counter()

        async def one(i: int) -> Reply:
            await asyncio.sleep(max(0.0, started + arrivals[i] - time.perf_counter()))
            return await chat(http, gateway, model, *asks[i])

        replies = await asyncio.gather(*(one(i) for i in range(len(asks))))
        wall = time.perf_counter() - started
    return list(replies), wall


def summary(replies: Sequence[Reply], wall: float) -> dict[str, Any]:
    hard = [r for r in replies if r.hard]
    return {
        "requests": len(replies), "failed": sum(r.status != 200 for r in replies),
        "small_share": round(sum(r.model == SMALL for r in replies) / max(1, len(replies)), 3),
        "hard_ttft_p50_ms": _stat(hard, "ttft_s", 0.5), "hard_ttft_p99_ms": _stat(hard, "ttft_s",
                                                                                 0.99),
        "hard_tpot_p50_ms": _stat(hard, "tpot_s", 0.5),
        "all_ttft_p50_ms": _stat(replies, "ttft_s", 0.5),
        "all_ttft_p99_ms": _stat(replies, "ttft_s", 0.99),
        "wall_s": round(wall, 2),
    }


def _stat(replies: Sequence[Reply], field: str, q: float) -> float | None:
    values: list[float] = sorted(
        v * 1e3 for r in replies if (v := getattr(r, field)) is not None)
    if not values:
        return None
    value = statistics.median(values) if q == 0.5 else values[min(len(values) - 1,
                                                                  int(q * len(values)))]
    return round(value, 1)


def _quiet(outcome: object) -> None:
    """No access log."""


async def run(args: argparse.Namespace) -> int:
    asks = plan(args.requests, args.easy_share, args.seed)
    print(f"{args.requests} streamed chats at {args.rate:g}/s (Poisson), "
          f"{args.easy_share:.0%} easy (64 tokens) and the rest hard (256); {args.large} x "
          f"{DEFAULT_PRESET} + {args.small} x {SMALL_PRESET}, time scale {args.time_scale:g}")
    print(f"{'run':16} {'small':>6} {'hard TTFT p50':>14} {'p99':>8} {'hard TPOT p50':>14}"
          f" {'all TTFT p50':>13} {'p99':>8} {'wall s':>7}")
    results: dict[str, Any] = {}
    failed = 0
    for name, model, mode in RUNS:
        s = summary(*await run_once(args, model, mode, asks))
        results[name] = s
        failed += s["failed"]
        print(f"{name:16} {s['small_share']:6.0%} {_f(s['hard_ttft_p50_ms']):>14}"
              f" {_f(s['hard_ttft_p99_ms']):>8} {_f(s['hard_tpot_p50_ms']):>14}"
              f" {_f(s['all_ttft_p50_ms']):>13} {_f(s['all_ttft_p99_ms']):>8}"
              f" {s['wall_s']:7.1f}", flush=True)
    if args.json:
        with open(args.json, "wb") as out:
            out.write(orjson.dumps({"config": {k: v for k, v in vars(args).items()
                                               if k not in ("json", "results_dir")},
                                    "runs": results}, option=orjson.OPT_INDENT_2))
    if failed:
        print(f"FAILED: {failed} requests failed (nothing recorded)")
        return 1
    save(args, "bench_small_model", title="Small-model routing: the hard requests' latency",
         command=args.command, tables=[table(results)],
         notes=f"{args.requests} streamed chats at {args.rate:g}/s (Poisson, open loop), "
               f"{args.easy_share:.0%} easy (64 tokens asked), the rest hard (256); {args.large} x "
               f"{DEFAULT_PRESET} with {args.large_blocks or 'its preset'} KV blocks + "
               f"{args.small} x {SMALL_PRESET}, time scale {args.time_scale:g}; the same "
               f"requests in every run; classifier {args.classifier}, whose work (for minilm, "
               "an embedding per easy request) shares the cores with the simulators.")
    return 0


def table(results: dict[str, Any]) -> Table:
    return Table("One run per routing (times in ms)",
                 ["run", "small model's share", "hard TTFT p50", "hard TTFT p99",
                  "hard TPOT p50", "all TTFT p50", "all TTFT p99", "failed", "wall s"],
                 [[name, s["small_share"], s["hard_ttft_p50_ms"], s["hard_ttft_p99_ms"],
                   s["hard_tpot_p50_ms"], s["all_ttft_p50_ms"], s["all_ttft_p99_ms"],
                   s["failed"], s["wall_s"]] for name, s in results.items()],
                 "Hard requests always need the large model: their latency is what moving the "
                 "easy ones away buys.")


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def decision(args: argparse.Namespace) -> int:
    from loadtest import small_model_decision

    rows, embedder = small_model_decision.measure(args.rounds, args.embed_rounds)
    print(f"{'step (ms)':48} {'calls':>6} {'CPU p50':>8} {'CPU p99':>8} {'CPU max':>8}"
          f" {'wall p50':>9} {'wall p99':>9}")
    for what, *figures in rows:
        print(f"{what!s:48} " + " ".join(f"{value!s:>8}" for value in figures))
    save(args, "bench_small_model_decision",
         title="Small-model routing: what the decision costs a request",
         command=args.command, tables=[small_model_decision.table(rows, embedder)],
         notes=f"Every prompt of tests/data/routing_prompts.jsonl, {args.rounds} rounds "
               f"({args.embed_rounds} for the embedding), each call timed alone in one thread.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_small_model",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0,
                        help="requests per second, Poisson arrivals (default 10)")
    parser.add_argument("--easy-share", type=float, default=0.7)
    parser.add_argument("--large", type=int, default=1)
    parser.add_argument("--small", type=int, default=1)
    parser.add_argument("--large-blocks", type=int, default=512,
                        help="the large backends' KV cache in 16-token blocks (default 512: 8k"
                        " tokens, a GPU whose memory mostly holds the weights; 0: the preset's)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    parser.add_argument("--classifier", default="auto", choices=("auto", "minilm", "hashed"),
                        help="the alias's classifier (default auto: minilm when installed)")
    parser.add_argument("--decision", action="store_true",
                        help="measure the routing decision's own cost instead (no servers)")
    parser.add_argument("--rounds", type=int, default=20,
                        help="--decision: rounds over the labelled prompts (default 20)")
    parser.add_argument("--embed-rounds", type=int, default=2,
                        help="--decision: rounds of the embedding (default 2)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.command = command("loadtest.bench_small_model", sys.argv[1:] if argv is None else argv)
    if args.decision:
        if args.rounds < 1 or args.embed_rounds < 1:
            print("bad usage: --rounds and --embed-rounds >= 1", file=sys.stderr)
            return 2
        return decision(args)
    if not (1 <= args.requests <= 20_000 and args.rate > 0 and args.large >= 1
            and args.small >= 1 and 0.0 <= args.easy_share <= 1.0 and args.time_scale > 0):
        print("bad usage: requests 1..20000; rate > 0; large, small >= 1; easy-share in 0..1",
              file=sys.stderr)
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
