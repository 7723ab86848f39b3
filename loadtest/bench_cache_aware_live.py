"""kvgate's `cache_aware` baseline beside the real SGLang and vLLM routers' `cache_aware`, on one
live fleet of simulators: where each sends the same requests.

    python -m loadtest.bench_cache_aware_live [--backends 4] [--groups 8] [--requests 240]
        [--burst 160] [--seed 0] [--no-record]

Four `kvgate sim` processes (llama-3-8b on H100, 100 times faster than the modelled GPU) on
loopback; in front of them, one at a time, `sglang-router` and `vllm-router` (installed from PyPI
into venvs of their own under /tmp, as `loadtest.bench_overhead` does; one that cannot be
installed or started is skipped with its reason) with `--policy cache_aware` and their
defaults, and `kvgate serve` with `routing.policy: cache_aware`. Each gets the same requests:
chats that share one of --groups system prompts (about 1,500 characters each, drawn with Zipf
weights, so a few groups are hot) before a question of their own.

Two phases per router, each started with the router fresh:
- one at a time (--requests): the approximate prefix trees alone decide, since the in-flight
  counts never pass the balance thresholds. The backend of each request is read from the
  simulators' own request counters, so the figures need nothing from the router.
- --burst requests at once, replies long enough that they overlap: the hot groups' backends
  pass the absolute (64) and relative (1.5x) balance thresholds and the rule sends the rest to
  the least loaded.

Reported per router and phase: each backend's share of the requests (sorted, largest first,
since which backend a group lands on first is a tie-break), how many backends a group used, and
the share of a group's requests that went to its most used backend. The check: every sorted
share within 10 percentage points of each real router's. The table goes to
`loadtest/results/bench_cache_aware_live.json` (--no-record: nowhere). Exit code 0 whatever the
outcome, 1 with --strict when a share is further than that.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from loadtest.bench_overhead_peers import (
    BenchProc,
    Started,
    _installed,
    _start,
    free_port,
)
from loadtest.results import Table, add_arguments, command, save

MODEL = "llama-3-8b"
PRESET = "llama-3-8b-h100"
SHARE_TOLERANCE = 0.10
ROUTERS = ("sglang-router", "vllm-router", "kvgate")
_WORDS = ("cache", "block", "token", "prefix", "route", "batch", "decode", "prefill", "tensor",
          "kernel", "queue", "stream", "model", "layer", "weight", "memory")


@dataclass(frozen=True, slots=True)
class Request:
    group: int
    body: dict[str, object]


def requests(groups: int, count: int, seed: int, max_tokens: int) -> list[Request]:
    """`count` chats over `groups` system prompts drawn with Zipf weights (1/rank)."""
    rng = random.Random(seed)
    systems = [f"You are assistant {g}. " + " ".join(rng.choice(_WORDS) for _ in range(220))
               for g in range(groups)]
    weights = [1.0 / (g + 1) for g in range(groups)]
    out = []
    for i in range(count):
        g = rng.choices(range(groups), weights)[0]
        question = f"Question {i}: " + " ".join(rng.choice(_WORDS) for _ in range(12))
        out.append(Request(g, {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                               "messages": [{"role": "system", "content": systems[g]},
                                            {"role": "user", "content": question}]}))
    return out


def sorted_shares(counts: Sequence[int]) -> list[float]:
    """Each backend's share of the requests, largest first."""
    total = sum(counts)
    return sorted((c / total for c in counts), reverse=True) if total else []


def share_gap(mine: Sequence[float], theirs: Sequence[float]) -> float:
    """The largest difference between two sorted share lists, rank by rank."""
    return max((abs(a - b) for a, b in zip(mine, theirs, strict=True)), default=0.0)


def affinity(placed: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """Over (group, backend) pairs: the mean number of backends a group used, and the share of
    the requests that went to their group's most used backend."""
    by_group: dict[int, Counter[int]] = {}
    for group, backend in placed:
        by_group.setdefault(group, Counter())[backend] += 1
    if not by_group:
        return 0.0, 0.0
    spread = sum(len(c) for c in by_group.values()) / len(by_group)
    top = sum(c.most_common(1)[0][1] for c in by_group.values()) / len(placed)
    return spread, top


async def _served(http: aiohttp.ClientSession, sims: Sequence[str]) -> list[int]:
    """Each simulator's count of requests it finished (vllm:request_success_total)."""
    counts = []
    for url in sims:
        async with http.get(url + "/metrics") as resp:
            text = await resp.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:request_success_total"):
                total += float(line.rsplit(" ", 1)[1])
        counts.append(int(total))
    return counts


async def _until_served(http: aiohttp.ClientSession, sims: Sequence[str], want: int,
                        deadline_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + deadline_s
    while True:
        counts = await _served(http, sims)
        if sum(counts) >= want or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.01)


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, object]) -> int:
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def one_at_a_time(http: aiohttp.ClientSession, url: str, sims: Sequence[str],
                        plan: Sequence[Request]) -> tuple[list[int], list[tuple[int, int]], int]:
    """Each request alone; its backend is the simulator whose counter moved."""
    before = await _served(http, sims)
    placed: list[tuple[int, int]] = []
    failed = 0
    for request in plan:
        if await _post(http, url, request.body) != 200:
            failed += 1
            continue
        after = await _until_served(http, sims, sum(before) + 1)
        moved = [i for i, (a, b) in enumerate(zip(after, before, strict=True)) if a > b]
        if len(moved) == 1:
            placed.append((request.group, moved[0]))
        before = after
    counts = [0] * len(sims)
    for _, backend in placed:
        counts[backend] += 1
    return counts, placed, failed


async def burst(http: aiohttp.ClientSession, url: str, sims: Sequence[str],
                plan: Sequence[Request]) -> tuple[list[int], int]:
    """All at once; the backends' shares from their counters' growth."""
    before = await _served(http, sims)
    statuses = await asyncio.gather(*(_post(http, url, r.body) for r in plan))
    ok = sum(s == 200 for s in statuses)
    after = await _until_served(http, sims, sum(before) + ok)
    return [a - b for a, b in zip(after, before, strict=True)], len(plan) - ok


def _router(name: str, sims: Sequence[str], workdir: Path) -> tuple[BenchProc | None, str]:
    if name == "kvgate":
        port = free_port()
        config = {"server": {"host": "127.0.0.1", "port": port},
                  "backends": [{"url": u, "id": f"sim{i}"} for i, u in enumerate(sims)],
                  "routing": {"policy": "cache_aware"}, "slo": {"admission": False},
                  "cache": {"enabled": False}}
        path = workdir / "kvgate.json"  # JSON is YAML
        path.write_bytes(orjson.dumps(config))
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path),
                "--log-level", "warning"]
        return _start(name, argv, port, "/ready", workdir), ""
    binary, prefix = (("vllm-router", ["{exe}"]) if name == "vllm-router"
                      else ("python", ["{exe}", "-m", "sglang_router.launch_router"]))
    exe, why = _installed(name, name, binary)
    if exe is None:
        return None, why
    port = free_port()
    argv = [a.format(exe=exe) for a in prefix] + [
        "--worker-urls", *sims, "--policy", "cache_aware", "--host", "127.0.0.1",
        "--port", str(port), "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(free_port())]
    try:
        return _start(name, argv, port, "/v1/models", workdir), ""
    except RuntimeError as exc:
        return None, str(exc)


def _sims(count: int, workdir: Path, started: Started) -> list[str]:
    urls = []
    for i in range(count):
        port = free_port()
        argv = [sys.executable, "-m", "gateway.cli", "sim", "--port", str(port), "--preset",
                PRESET, "--model", MODEL, "--time-scale", "100", "--seed", str(i)]
        urls.append(started.add(_start(f"sim{i}", argv, port, "/health", workdir)).url)
    return urls


async def _phases(name: str, sims: Sequence[str], workdir: Path, args: argparse.Namespace,
                  sequential: Sequence[Request], bursty: Sequence[Request]) -> dict[str, object]:
    figures: dict[str, object] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        for phase in ("one at a time", "burst"):
            with Started() as started:
                proc, why = _router(name, sims, workdir)
                if proc is None:
                    return {"skipped": why}
                started.add(proc)
                if phase == "one at a time":
                    counts, placed, failed = await one_at_a_time(http, proc.url, sims,
                                                                 sequential)
                    spread, top = affinity(placed)
                    figures[phase] = {"counts": counts, "failed": failed,
                                      "groups' backends": spread, "top backend": top}
                else:
                    counts, failed = await burst(http, proc.url, sims, bursty)
                    figures[phase] = {"counts": counts, "failed": failed}
    return figures


def _tables(results: dict[str, dict[str, object]], args: argparse.Namespace
            ) -> tuple[list[Table], list[str]]:
    rows: list[list[object]] = []
    missed: list[str] = []
    for phase in ("one at a time", "burst"):
        mine = results.get("kvgate", {}).get(phase)
        mine_shares = sorted_shares(mine["counts"]) if isinstance(mine, dict) else []
        for name in ROUTERS:
            got = results.get(name, {})
            if "skipped" in got:
                rows.append([phase, name, f"skipped: {got['skipped']}", "-", "-", "-", "-"])
                continue
            figures = got.get(phase)
            if not isinstance(figures, dict):
                continue
            shares = sorted_shares(figures["counts"])
            gap = share_gap(mine_shares, shares) if name != "kvgate" and mine_shares else None
            if gap is not None and gap > SHARE_TOLERANCE:
                missed.append(f"{phase}: kvgate vs {name} {gap:.3f}")
            rows.append([phase, name, " / ".join(f"{s:.3f}" for s in shares),
                         "-" if gap is None else round(gap, 3),
                         round(float(figures.get("groups' backends", 0.0)), 2)
                         if "groups' backends" in figures else "-",
                         round(float(figures.get("top backend", 0.0)), 3)
                         if "top backend" in figures else "-", figures["failed"]])
    title = (f"cache_aware on {args.backends} simulators: kvgate's baseline beside the real "
             f"routers ({args.requests} requests one at a time, then {args.burst} at once)")
    table = Table(title, ["phase", "router", "shares, largest first", "gap to kvgate",
                          "backends per group", "to the group's top backend", "failed"], rows,
                  f"{args.groups} system prompts of about 1,500 characters, Zipf-weighted; the "
                  f"gap is the largest difference rank by rank (tolerance "
                  f"{SHARE_TOLERANCE:.2f}).")
    return [table], missed


async def run(args: argparse.Namespace) -> int:
    sequential = requests(args.groups, args.requests, args.seed, max_tokens=4)
    bursty = requests(args.groups, args.burst, args.seed + 1, max_tokens=400)
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-cache-aware-") as tmp, Started() as started:
        workdir = Path(tmp)
        sims = _sims(args.backends, workdir, started)
        for name in ROUTERS:
            print(f"== {name}", flush=True)
            results[name] = await _phases(name, sims, workdir, args, sequential, bursty)
            print(orjson.dumps(results[name]).decode(), flush=True)
    tables, missed = _tables(results, args)
    for table in tables:
        print(f"\n{table.title}")
        for row in [table.columns, *table.rows]:
            print("  ".join(str(cell) for cell in row))
    print("\nwithin tolerance" if not missed else "\nbeyond tolerance: " + "; ".join(missed))
    save(args, "bench_cache_aware_live", title="cache_aware, live: kvgate beside the real routers",
         command=command("loadtest.bench_cache_aware_live", sys.argv[1:]), tables=tables,
         notes="Wall-clock runs on loopback; which backend a group lands on first is a "
               "tie-break, so shares are compared sorted.")
    return 1 if args.strict and missed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_cache_aware_live",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backends", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--burst", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strict", action="store_true", help="exit 1 beyond the tolerance")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
