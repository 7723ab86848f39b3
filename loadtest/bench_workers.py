"""`kvgate serve --workers 2` against one worker: CPU per request, throughput, and whether the
host's ledger sees every worker's requests.

    .venv/bin/python -m loadtest.bench_workers [--requests 1500] [--rounds 3]
        [--concurrency 8] [--time-scale 1000] [--no-record]

Layout, loopback only: one simulated backend (`kvgate sim`) in a process of its own, and two
gateways as `kvgate serve` processes in front of it, one with `--workers 1` and one with
`--workers 2` (a supervisor running the host's poller, and two workers). This process is the load
generator: each round sends the same closed-loop load (`--concurrency` clients, each on a
keep-alive connection of its own, which SO_REUSEPORT gives to one worker; 16 output tokens,
JSON) to each gateway in turn, the order rotating every round, and reads the CPU time of every
gateway process from /proc around it. Each answer names its worker (`x-kvgate-worker`).

Reported, as the median over the rounds: the workers' CPU microseconds per request (the
single gateway's includes its poller; with two workers the poller is the supervisor's, shown
apart), the same less what the workers spend idle (measured for `--idle-s` before the rounds),
the host's CPU per request (every gateway process), requests per second, and the most requests
in flight the host's ledger showed (`/admin/backends`, sampled during one more round of the
same load, apart from the measured ones: its own CPU would count as the requests'). On a 2-core
machine shared with the simulator and the load generator, requests per second cannot show how
throughput scales with workers: every process competes for the same two cores; the CPU per
request can.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import uvloop

from gateway.workers.worker import WORKER_HEADER
from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from loadtest.sim.process import sim_process

MODEL = PRESETS[DEFAULT_PRESET].model_name
START_S = 180.0
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Gateway:
    workers: int
    process: asyncio.subprocess.Process
    url: str

    def pids(self) -> dict[str, int]:
        """The processes doing the work: 'worker N' and, with several workers, 'supervisor'."""
        pid = self.process.pid
        if self.workers == 1:
            return {"worker": pid}
        out = {"supervisor": pid}
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                out[f"worker {child}"] = int(child)
        return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


@asynccontextmanager
async def serving(backend: str, workers: int) -> AsyncIterator[Gateway]:
    env = {**os.environ, "KVGATE_ROUTING__POLICY": "cost"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--backend", backend, "--port", "0",
        "--workers", str(workers), "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    drain: asyncio.Task[None] | None = None
    try:
        url = ""
        async with asyncio.timeout(START_S):
            while not url:
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"kvgate serve --workers {workers} did not start")
                if line.startswith(b"kvgate serve: http://"):
                    url = line.split()[2].decode().removesuffix("/v1")

        async def read_on() -> None:
            assert proc.stdout is not None
            while await proc.stdout.read(65536):
                pass

        drain = asyncio.ensure_future(read_on())
        gateway = Gateway(workers, proc, url)
        if workers > 1:  # every worker listens once the supervisor says so; wait for its pids
            async with asyncio.timeout(START_S):
                while len(gateway.pids()) < workers + 1:
                    await asyncio.sleep(0.1)
        yield gateway
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


@dataclass
class Phase:
    workers: int
    seconds: float
    answered: Counter[str]  # by worker index
    cpu: dict[str, float]  # by process name: seconds
    ledger_max: int = 0
    errors: int = 0
    idle_per_s: float = 0.0  # the workers' CPU seconds per second with no load


BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": 16, "min_tokens": 16}


async def phase(gateway: Gateway, requests: int, concurrency: int,
                watch_ledger: bool = False) -> Phase:
    """One closed-loop load. `watch_ledger`: sample `/admin/backends` meanwhile (its own CPU
    would be charged to the requests: not in the phases that measure CPU)."""
    pids = gateway.pids()
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    answered: Counter[str] = Counter()
    errors = 0
    ledger_max = 0
    left = requests
    done = asyncio.Event()

    async def client() -> None:
        nonlocal left, errors
        connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection per client
        async with aiohttp.ClientSession(connector=connector) as http:
            while left > 0:
                left -= 1
                async with http.post(gateway.url + "/v1/chat/completions", json=BODY) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                    answered[resp.headers.get(WORKER_HEADER, "0")] += 1

    async def watch() -> None:
        nonlocal ledger_max
        async with aiohttp.ClientSession() as http:
            while watch_ledger and not done.is_set():
                async with http.get(gateway.url + "/admin/backends") as resp:
                    rows = orjson.loads(await resp.read())["backends"]
                ledger_max = max(ledger_max, sum(int(r["inflight"]) for r in rows))
                await asyncio.sleep(0.02)

    loop = asyncio.get_running_loop()
    watcher = asyncio.ensure_future(watch())
    started = loop.time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = loop.time() - started
    done.set()
    await watcher
    cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    return Phase(gateway.workers, seconds, answered, cpu, ledger_max, errors)


def worker_us(p: Phase, net: bool = False) -> float:
    """The workers' CPU µs per request: every worker process's CPU (not the supervisor's) over
    the requests they answered; `net`: less what they spend idle (timers, the feed) meanwhile."""
    cpu = sum(seconds for name, seconds in p.cpu.items() if name != "supervisor")
    if net:
        cpu -= p.idle_per_s * p.seconds
    return cpu / sum(p.answered.values()) * 1e6


async def idle_rate(gateways: Sequence[Gateway], seconds: float) -> dict[int, float]:
    """Each gateway's workers' CPU seconds per second while none is loaded."""
    pids = {g.workers: {n: p for n, p in g.pids().items() if n != "supervisor"}
            for g in gateways}
    before = {w: sum(cpu_seconds(p) for p in ps.values()) for w, ps in pids.items()}
    await asyncio.sleep(seconds)
    return {w: (sum(cpu_seconds(p) for p in ps.values()) - before[w]) / seconds
            for w, ps in pids.items()}


async def bench(args: argparse.Namespace) -> list[Phase]:
    phases: list[Phase] = []
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(sim_process(time_scale=args.time_scale))
        gateways = [await stack.enter_async_context(serving(sim.url, n)) for n in (1, 2)]
        for g in gateways:  # warm up: connections, first scrapes, learned speeds
            await phase(g, min(200, args.requests), args.concurrency)
        idle = await idle_rate(gateways, args.idle_s)
        for r in range(args.rounds):
            for g in gateways[r % 2:] + gateways[: r % 2]:
                phases.append(await phase(g, args.requests, args.concurrency))
                phases[-1].idle_per_s = idle[g.workers]
                print(f"round {r}: --workers {g.workers}: {phases[-1].answered}, "
                      f"{phases[-1].seconds:.1f} s", file=sys.stderr, flush=True)
        for g in gateways:
            watched = await phase(g, min(400, args.requests), args.concurrency, True)
            for measured in phases:
                if measured.workers == g.workers:
                    measured.ledger_max = max(measured.ledger_max, watched.ledger_max)
    return phases


def tables(phases: Sequence[Phase], concurrency: int) -> list[Table]:
    rows = []
    ratios = []
    by = {n: [p for p in phases if p.workers == n] for n in (1, 2)}
    net_ratios = []
    for one, two in zip(by[1], by[2], strict=False):
        ratios.append(worker_us(two) / worker_us(one))
        net_ratios.append(worker_us(two, True) / worker_us(one, True))
    for n, ps in by.items():
        per_worker = statistics.median(worker_us(p) for p in ps)
        net = statistics.median(worker_us(p, True) for p in ps)
        idle_ms = ps[0].idle_per_s * 1000 / n
        host_us = statistics.median(sum(p.cpu.values()) / sum(p.answered.values()) * 1e6
                                    for p in ps)
        sup_us = statistics.median(p.cpu.get("supervisor", 0.0) / sum(p.answered.values())
                                   * 1e6 for p in ps)
        rate = statistics.median(sum(p.answered.values()) / p.seconds for p in ps)
        share = statistics.median(max(p.answered.values()) / sum(p.answered.values())
                                  for p in ps)
        rows.append([n, round(per_worker), round(net), round(idle_ms, 1),
                     round(sup_us) if n > 1 else None, round(host_us),
                     round(rate), round(share, 2), max(p.ledger_max for p in ps),
                     sum(p.errors for p in ps)])
    ratio, net_ratio = statistics.median(ratios), statistics.median(net_ratios)
    notes = (f"Worker CPU per request with 2 workers over 1 worker (per round): "
             f"median {ratio:.2f}x, {net_ratio:.2f}x net of each process's idle CPU "
             f"(target at most 1.1x; at this low a load a worker's fixed cost per second, "
             f"paid by each worker, weighs on every request). Ledger max: the most requests in "
             f"flight `/admin/backends` showed for the host, at {concurrency} requests at once; "
             f"with 2 workers each answering about half of them, a figure near {concurrency} "
             f"means every worker reads every worker's requests. Throughput on this 2-core "
             f"machine shared by the simulator, the load generator and the gateway's processes "
             f"cannot show saturation scaling.")
    return [Table(
        "kvgate serve --workers 1 and 2, one simulated backend, closed loop",
        ["workers", "worker CPU µs/request", "net of idle µs/request", "idle ms/s per worker",
         "supervisor (poller) µs/request",
         "host CPU µs/request", "requests/s", "busiest worker's share", "ledger max in flight",
         "errors"], rows, notes)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--time-scale", type=float, default=1000.0)
    parser.add_argument("--idle-s", type=float, default=5.0,
                        help="how long the idle CPU of each gateway is measured")
    add_arguments(parser)
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(args_list)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        phases = runner.run(bench(args))
    result = tables(phases, args.concurrency)
    for row in result[0].rows:
        print(row)
    print(result[0].notes)
    save(args, "bench_workers", title="Worker processes: CPU per request and the shared ledger",
         command=command("loadtest.bench_workers", args_list), tables=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
