"""The gateway's CPU per request on a miss, with the semantic tier on and off, side by side
(loadtest/bench_cache.py's third part).

One simulated backend runs in a process of its own, and two gateways, each `kvgate serve` in a
process of its own, identical but for `cache.semantic` (on with the hashing embedder, and off;
the exact tier on in both, in memory), pinned to one CPU. Each round sends the same `requests`
new questions (so every one is a miss: the semantic tier embeds it, searches its namespace,
runs the guard over the candidates and stores the answer with its vector) to one gateway and
then the other, the order alternating, `concurrency` at a time, and reads each gateway's CPU
time around its phase from /proc (every thread's run time, in nanoseconds, from
`/proc/PID/task/*/schedstat`). The questions are the evaluation sets' (`question_pool`), each
asked once: one gateway's namespace fills with them as traffic would fill it, near misses
among them, which the guard vetoes. Reported: the median over the rounds of CPU microseconds
per request of each, and the median of the per-round ratios on/off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gateway.cache.eval import DATA, FRESH, load_pairs
from loadtest.redis_server import free_port
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
START_S = 60.0


def cpu_ns(pid: int) -> int:
    """Nanoseconds the process `pid` has run on a CPU, every thread counted."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def question_pool() -> list[str]:
    """Distinct, everyday and technical questions: the first question of each labelled pair of
    the cache's evaluation sets (near misses among them, no two the same question)."""
    seen: dict[str, None] = {}
    for path in (DATA, FRESH):
        for pair in load_pairs(path):
            seen.setdefault(pair.a)
    return list(seen)


def questions(pool: Sequence[str], round_number: int, count: int) -> list[str]:
    """Round `round_number`'s questions: its own slice of the pool (round 0 warms up)."""
    start = round_number * count
    if start + count > len(pool):
        raise ValueError(f"{len(pool)} questions: at most {len(pool) // count - 1} rounds of"
                         f" {count}")
    return list(pool[start:start + count])


@asynccontextmanager
async def _process(args: Sequence[str], cpus: set[int]) -> AsyncIterator[
        asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
        await proc.wait()


async def _sim(stack: AsyncExitStack, time_scale: float, cpus: set[int]) -> str:
    proc = await stack.enter_async_context(_process(
        ["-m", "loadtest.sim.cli", "--port", "0", "--time-scale", str(time_scale)], cpus))
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), START_S)).decode()
    url = line.rsplit(" on ", 1)[-1].strip()
    if not url.startswith("http://127.0.0.1:"):
        raise RuntimeError(f"the simulator did not start: {line!r}")
    return url


async def _gateway(stack: AsyncExitStack, http: aiohttp.ClientSession, backend: str,
                   semantic: str, directory: Path, cpus: set[int]) -> tuple[int, str]:
    """A `kvgate serve` process; its pid and base URL once /health answers."""
    port = free_port()
    config = directory / f"semantic-{semantic}.yaml"
    config.write_bytes(orjson.dumps({
        "server": {"host": "127.0.0.1", "port": port},
        "backends": [{"url": backend, "id": "sim0"}],
        "routing": {"poll_interval_s": 1.0},
        "telemetry": {"access_log_sample_rate": 0.0},
        "cache": {"enabled": True, "semantic": semantic, "embedder": "hashing"},
    }))  # JSON is YAML
    proc = await stack.enter_async_context(_process(
        ["-m", "gateway.cli", "serve", "--config", str(config), "--log-level", "warning"],
        cpus))
    url = f"http://127.0.0.1:{port}"
    deadline = asyncio.get_running_loop().time() + START_S
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(url + "/ready") as resp:
                if resp.status == 200:
                    return proc.pid, url
        if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"the gateway (semantic {semantic}) did not get ready")
        await asyncio.sleep(0.1)


async def _ask(http: aiohttp.ClientSession, url: str, question: str) -> str:
    body = {"model": MODEL, "stream": True, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": question}]}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"a request failed with {resp.status}")
        return resp.headers.get("x-kvgate-cache", "-")


async def _phase(http: aiohttp.ClientSession, pid: int, url: str, asks: Sequence[str],
                 concurrency: int) -> tuple[int, int]:
    """CPU nanoseconds the gateway spent on `asks`, and how many were cache hits."""
    todo = iter(asks)
    hits = 0

    async def worker() -> None:
        nonlocal hits
        for question in todo:
            hits += await _ask(http, url, question) in ("exact", "semantic")

    before = cpu_ns(pid)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await asyncio.sleep(0.05)  # the stores that run after the answer went out
    return cpu_ns(pid) - before, hits


async def cpu_per_request(*, rounds: int, requests: int, concurrency: int,
                          time_scale: float, cpus: set[int]) -> dict[str, Any]:
    """Each gateway's median CPU µs per request over the rounds, and the median ratio."""
    per: dict[str, list[float]] = {"on": [], "off": []}
    ratios: list[float] = []
    hits = 0
    async with AsyncExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvgate-")))
        http = await stack.enter_async_context(aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0)))
        backend = await _sim(stack, time_scale, set())
        gateways = {semantic: await _gateway(stack, http, backend, semantic, directory, cpus)
                    for semantic in ("on", "off")}
        pool = question_pool()
        for semantic in gateways:  # warm: connections, first imports
            await _phase(http, *gateways[semantic], questions(pool, 0, requests), concurrency)
        for round_number in range(1, rounds + 1):
            asks = questions(pool, round_number, requests)
            order = ("on", "off") if round_number % 2 else ("off", "on")
            spent = {}
            for semantic in order:
                spent[semantic], found = await _phase(http, *gateways[semantic], asks,
                                                      concurrency)
                hits += found
                per[semantic].append(spent[semantic] / requests / 1e3)
            ratios.append(spent["on"] / spent["off"])
    return {"rounds": rounds, "requests": requests, "hits": hits,
            "on_us": round(statistics.median(per["on"]), 1),
            "off_us": round(statistics.median(per["off"]), 1),
            "ratio": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}
