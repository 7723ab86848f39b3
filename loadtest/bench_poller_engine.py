"""What the poller costs against a real vLLM server, which answers every scrape in full.

    scripts/real-engines.sh serve-vllm 8100 &   # a real vLLM (the CPU build) on loopback
    .venv/bin/python -m loadtest.bench_poller_engine --url http://127.0.0.1:8100
                                                     [--seconds 20] [--streams 4] [--no-record]

vLLM ignores the `name[]` filter the poller sends between its full scrapes (prometheus_client's
filter is not wired into its /metrics route), so every scrape carries the whole exposition, tens
of KB with its histograms. The real `Poller` runs in a fresh process of its own on uvloop, at the
gateway's defaults (interval, group size, full-scrape interval), against the server, first idle,
then while `--streams` long `ignore_eos` streams run on it (sent from this process, so their
client's CPU is not counted): after a warm-up it reads its own process CPU time (user + system)
over `--seconds`. A figure per row: the share of one core per backend (the target: under 2%),
the CPU per scrape, the scrapes per second and the answer's size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from loadtest.bench_scrape import measure
from loadtest.results import Table, add_arguments, command, save

TARGET_SHARE = 0.02  # of one core, per backend


async def answer_bytes(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/metrics") as resp:
        return len(await resp.read())


async def model_of(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/v1/models") as resp:
        model: str = (await resp.json())["data"][0]["id"]
        return model


@contextlib.asynccontextmanager
async def streams(http: aiohttp.ClientSession, url: str, count: int) -> AsyncIterator[None]:
    """`count` long ignore_eos streams running on the server, restarted as they end."""
    model = await model_of(http, url)
    body = {"model": model, "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": 1500, "ignore_eos": True, "stream": True}

    async def one() -> None:
        while True:
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                await resp.read()

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run(args: argparse.Namespace) -> Table:
    rows: list[list[Any]] = []
    async with aiohttp.ClientSession() as http:
        for workload, count in (("idle", 0), (f"{args.streams} streams", args.streams)):
            async with streams(http, args.url, count):
                size = await answer_bytes(http, args.url)
                result = await asyncio.to_thread(
                    measure, "as-is", [args.url], args.warmup, args.seconds)
            share, scrapes = result["share"], result["scrapes"]
            per_scrape_ms = 1000 * share / scrapes if scrapes else None
            rows.append([workload, round(size / 1024, 1), round(scrapes, 1),
                         None if per_scrape_ms is None else round(per_scrape_ms, 3),
                         round(100 * share, 2), "yes" if share < TARGET_SHARE else "no"])
            print(f"{workload}: {rows[-1]}", flush=True)
    return Table(
        "The poller against one real vLLM (CPU build), at the gateway's defaults",
        ["workload", "answer KB", "scrapes/s", "CPU ms per scrape", "% of a core",
         "under 2%"],
        rows,
        "The poller's own process CPU (user + system) over the measured seconds, one backend:"
        " the share of a core per backend the gateway spends reading a vLLM that ignores the"
        " name[] filter.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_poller_engine",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="a running vLLM server, without /v1")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per row")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--streams", type=int, default=4,
                        help="long streams running on the server in the busy row")
    add_arguments(parser)
    args = parser.parse_args(argv)
    table = asyncio.run(run(args))
    save(args, "bench_poller_engine", title="The poller's cost against a real vLLM",
         command=command("loadtest.bench_poller_engine",
                         sys.argv[1:] if argv is None else argv),
         tables=[table])
    return 0


if __name__ == "__main__":
    sys.exit(main())
