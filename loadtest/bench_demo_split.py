"""`kvgate demo`'s split, live: how a burst of concurrent streams divides among its identical
large backends, and the speed the gateway learned for each.

    .venv/bin/python -m loadtest.bench_demo_split [--streams 60] [--rounds 3] [--max-tokens 128]

Starts `kvgate demo` itself (its simulators each a process of its own, on free loopback ports)
on a free port, waits until it is ready, then sends `--rounds` bursts of `--streams` concurrent
streamed chats to the large model, each burst after the last has ended. After each burst it
reads every backend's share (the `x-kvgate-backend` header of its streams) and the learned
speed scales (`speed_scale` in `/admin/backends`). Targets: no backend above 45% of a burst,
the scales within 15% of each other. The demo is stopped by its PID (SIGINT, as a user's
Ctrl-C) at the end, on an error too.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0
MAX_SHARE = 0.45
MAX_SCALE_SPREAD = 1.15


@dataclass(frozen=True, slots=True)
class Burst:
    round: int
    shares: dict[str, float]  # backend id -> fraction of the burst's streams
    scales: dict[str, float | None]  # backend id -> learned speed scale after the burst
    replies: dict[str, int]  # backend id -> replies its speed rests on
    failed: int

    @property
    def top_share(self) -> float:
        return max(self.shares.values(), default=1.0)

    @property
    def scale_spread(self) -> float | None:
        known = [s for s in self.scales.values() if s]
        if len(known) < len(self.scales) or not known:
            return None
        return max(known) / min(known)

    @property
    def ok(self) -> bool:
        spread = self.scale_spread
        return (not self.failed and self.top_share <= MAX_SHARE and spread is not None
                and spread <= MAX_SCALE_SPREAD)


async def demo_url(stdout: asyncio.StreamReader) -> str:
    """The gateway's base URL, from the banner's first line; read through its last line."""
    url = ""
    while True:
        raw = await stdout.readline()
        if not raw:
            raise RuntimeError("kvgate demo exited before its banner")
        line = raw.decode()
        if line.startswith("kvgate demo: gateway on "):
            url = line.split(" on ", 1)[1].strip().removesuffix("/v1")
        if "Ctrl-C" in line:
            return url


async def stream_one(http: aiohttp.ClientSession, url: str, model: str, i: int,
                     max_tokens: int) -> str | None:
    """One streamed chat to its end; the backend that served it (None: it failed)."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 1.0,
            "messages": [{"role": "user", "content": f"request {i}: " + "tell me more " * 20}]}
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            return None
        await resp.read()
        return resp.headers.get("x-kvgate-backend")


async def backends(http: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with http.get(f"{url}/admin/backends") as resp:
        rows: list[dict[str, Any]] = orjson.loads(await resp.read())["backends"]
        return rows


async def wait_ready(http: aiohttp.ClientSession, url: str, model: str, large: int) -> None:
    """Until every large backend has been scraped and serves the model."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
    while True:
        rows = await backends(http, url)
        if sum(1 for r in rows if r.get("healthy") and model in (r.get("models") or [])) >= large:
            return
        if loop.time() > deadline:
            raise RuntimeError("the demo's backends never became healthy")
        await asyncio.sleep(0.1)


async def burst(http: aiohttp.ClientSession, url: str, model: str, n: int, round_: int,
                max_tokens: int, large: list[str]) -> Burst:
    served = await asyncio.gather(*(stream_one(http, url, model, round_ * n + i, max_tokens)
                                    for i in range(n)))
    counts = Counter(b for b in served if b is not None)
    rows = {r["id"]: r for r in await backends(http, url)}
    return Burst(round_ + 1, {b: counts[b] / n for b in large},
                 {b: rows[b].get("speed_scale") for b in large},
                 {b: int(rows[b].get("speed_replies") or 0) for b in large},
                 sum(1 for b in served if b is None))


async def run(args: argparse.Namespace) -> int:
    model = PRESETS[DEFAULT_PRESET].model_name
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "demo", "--port", "0", "--backends",
        str(args.backends), "--time-scale", repr(args.time_scale),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    results: list[Burst] = []
    try:
        url = await asyncio.wait_for(demo_url(proc.stdout), START_TIMEOUT_S)
        large = [f"sim{i}" for i in range(args.backends)]
        timeout = aiohttp.ClientTimeout(total=600)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            await wait_ready(http, url, model, args.backends)
            print(f"{args.rounds} bursts of {args.streams} concurrent streams "
                  f"({args.max_tokens} tokens) to {model} on {args.backends} x {DEFAULT_PRESET}"
                  f" (time scale {args.time_scale:g})")
            for r in range(args.rounds):
                b = await burst(http, url, model, args.streams, r, args.max_tokens, large)
                results.append(b)
                print(f"burst {b.round}: shares "
                      + " ".join(f"{k} {v:.0%}" for k, v in b.shares.items())
                      + " | scales " + " ".join(f"{k} {_f(v)}" for k, v in b.scales.items())
                      + f" | spread {_f(b.scale_spread)} | failed {b.failed}", flush=True)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    ok = bool(results) and all(b.ok for b in results)
    print("targets (no backend above 45%, scales within 15%):", "met" if ok else "NOT met")
    save(args, "bench_demo_split", title="kvgate demo: a burst's split and the learned speeds",
         command=args.command, tables=[table(results)],
         notes=f"`kvgate demo --backends {args.backends}` started fresh (each simulator a "
               f"process of its own, sharing the machine's cores); {args.rounds} bursts of "
               f"{args.streams} concurrent streams of {args.max_tokens} tokens to {model}, each "
               "after the last ended. Targets: no backend above 45% of a burst, the learned "
               "speed scales within 15% of each other.")
    return 0 if ok else 1


def table(results: Sequence[Burst]) -> Table:
    ids = list(results[0].shares) if results else []
    return Table(
        "Per burst: each large backend's share of the streams and its learned speed scale",
        ["burst", *(f"{b} share" for b in ids), "top share", *(f"{b} scale" for b in ids),
         "scale spread", "replies (min)", "failed"],
        [[b.round, *(round(b.shares[i], 3) for i in ids), round(b.top_share, 3),
          *(b.scales[i] for i in ids),
          None if b.scale_spread is None else round(b.scale_spread, 3),
          min(b.replies.values(), default=0), b.failed] for b in results],
        "A scale is the backend's step times over the reference profile's, as the gateway "
        "learned them (`speed_scale` in /admin/backends); the spread is the largest over the "
        "smallest. Identical simulators should read alike and split a burst evenly.")


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_demo_split",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=60, help="streams per burst (default 60)")
    parser.add_argument("--rounds", type=int, default=3, help="bursts (default 3)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--backends", type=int, default=3, help="large simulators (default 3)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.command = command("loadtest.bench_demo_split", sys.argv[1:] if argv is None else argv)
    if not (1 <= args.streams <= 1000 and 1 <= args.rounds <= 20 and args.max_tokens >= 2
            and 1 <= args.backends <= 16 and args.time_scale > 0):
        print("bad usage: streams 1..1000, rounds 1..20, max-tokens >= 2, backends 1..16, "
              "time-scale > 0", file=sys.stderr)
        return 2
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
