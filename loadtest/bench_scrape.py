"""What each piece of the scrape stack saves: the poller's own CPU, piece by piece.

    .venv/bin/python -m loadtest.bench_scrape [--backends 8,64,256] [--seconds 5] [--repeats 3]
                                              [--workloads busy,idle] [--variants ...]
                                              [--baseline DIR [--baseline-name TEXT]]
                                              [--no-record]

docs/design.md gives the figures and what each piece does.

The backends are metrics endpoints in ONE separate process (aiohttp, one port per backend, on
127.0.0.1), serving the simulator's vLLM V1 exposition (loadtest/sim/exposition.py) as a vLLM
server does: `/metrics?name[]=...` answered with only the samples asked for, as
prometheus_client filters. Two workloads, one path each (a backend's URL is
`http://127.0.0.1:<port>/<workload>`):
- busy: the engine's figures (running, waiting, KV usage, counters, latency histograms) take a
  step at every answer, as a loaded server's do between two scrapes.
- idle: nothing moves but the process's CPU counter, as on an idle server.
- unfiltered-idle: idle, from a server that ignores the `name[]` query (as TGI, TensorRT-LLM,
  llama.cpp and some vLLM deployments do): the whole payload at every scrape, its process CPU
  counter moving.
Each answer is one of a cycle of pre-rendered ones (each backend at its own offset), so the
server process answers as fast at every poller variant.

Each measurement runs the real `Poller` in a fresh process of its own, against the first N
backends, at the gateway's default interval (0.1 s), group size and full-scrape interval, on
uvloop as the gateway does; after a warm-up it reads its own process CPU time (user + system)
over `--seconds`: the share of one core. The variants, each the poller as it is with one piece
taken out (`--variants`, default all):
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple
from urllib.parse import parse_qs

import aiohttp
import uvloop
from aiohttp import web

from loadtest.results import Table, record
from loadtest.sim.engine import EngineStats
from loadtest.sim.exposition import CONTENT_TYPE, ProcessSample, ServerInfo, VllmV1Format
from routing.fleet import Fleet
from routing.poller import Poller
from routing.state import BackendSpec

INTERVAL = 0.1  # the gateway's default `routing.poll_interval_s`
CYCLE = 64  # pre-rendered answers per workload and query
WORKLOADS = ("busy", "idle", "unfiltered-idle")


class Variant(NamedTuple):
    """One poller configuration: `aiohttp` scrapes through an aiohttp session instead of the
    keep-alive client; `full_every` 1 asks for every name at every scrape (no hot tier);
    `templates` False parses every hot answer whole; `series_equal` False parses an answer
    whose series are the last one's."""

    what: str
    aiohttp: bool = False
    templates: bool = True
    series_equal: bool = True
    full_every: int | None = None


VARIANTS: Mapping[str, Variant] = {
    "as-is": Variant("the poller as it is"),
    "aiohttp-plain": Variant("aiohttp client, every answer parsed whole, every name every time",
                             aiohttp=True, templates=False, series_equal=False, full_every=1),
    "no-keepalive-client": Variant("aiohttp's client instead of the keep-alive one",
                                   aiohttp=True),
    "no-hot-full": Variant("no hot/full scrapes (every name every time)", full_every=1),
    "no-templates": Variant("no number templates", templates=False),
    "no-series-equal": Variant("no series-equal reuse", series_equal=False),
}
__doc__ += "".join(f"- {name}: {v.what}\n" for name, v in VARIANTS.items())
__doc__ += """
The runs are interleaved (every variant at every size, then again, `--repeats` times, the order
rotated each round) so that the machine's other load falls on all of them alike; the table gives
the median of the repeats, and each piece's saving is its variant's median minus the as-is one.
`--baseline DIR` adds a variant "baseline": the as-is poller of the source tree at DIR (a checkout
of other code that has this benchmark), run beside the others in the same rounds.
"""


# The backends' process.


def _busy_stats(rng: random.Random, steps: int) -> list[EngineStats]:
    blocks, out = 27313, []
    running, waiting, preempted, queries, hits, prompt, generated = 24, 2, 0, 0, 0, 0, 0
    finished = {"stop": 0, "length": 0, "abort": 0, "error": 0}
    for _ in range(steps):
        running = max(0, min(64, running + rng.randint(-3, 3)))
        waiting = max(0, min(16, waiting + rng.randint(-2, 2)))
        free = max(0, blocks - 1 - running * rng.randint(60, 180))
        preempted += rng.random() < 0.05
        new_prompt = rng.randint(0, 8000)
        queries += new_prompt
        hits += int(new_prompt * rng.uniform(0.2, 0.8))
        prompt += new_prompt
        generated += running * rng.randint(3, 6)
        finished["stop"] += rng.randint(0, 3)
        finished["length"] += rng.random() < 0.2
        out.append(EngineStats(running, waiting, blocks, 16, free, blocks - free,
                               1 - free / (blocks - 1), preempted, queries, hits, prompt,
                               generated, dict(finished)))
    return out


class Exposition:
    """A cycle of `CYCLE` answers per workload and `name[]` set, rendered on first use."""

    def __init__(self, seed: int = 1) -> None:
        self._format = VllmV1Format()
        self._info = ServerInfo(model_name="meta-llama/Llama-3.1-8B-Instruct",
                                max_model_len=131072)
        rng = random.Random(seed)
        busy = _busy_stats(rng, CYCLE)
        idle = [busy[0]._replace(running=0, waiting=0)] * CYCLE
        self._stats = {"busy": busy, "idle": idle, "unfiltered-idle": idle}
        self._answers: dict[tuple[str, tuple[str, ...] | None], list[bytes]] = {}

    def answers(self, workload: str, names: tuple[str, ...] | None) -> list[bytes]:
        key = workload, names
        if key not in self._answers:
            latency = self._format.new_recorder()
            rng = random.Random(2)
            rendered = []
            for step, stats in enumerate(self._stats[workload]):
                if workload == "busy":
                    for _ in range(stats.running // 4):
                        latency.ttft.observe(rng.expovariate(8.0))
                        latency.itl.observe(rng.expovariate(40.0))
                        latency.e2e.observe(rng.expovariate(0.2))
                process = ProcessSample(812.0 + step / 100, 1.7e9)
                text = self._format.render(stats, latency, self._info, process, names)
                rendered.append(text.encode())
            self._answers[key] = rendered
        return self._answers[key]


async def serve(count: int) -> None:
    """`count` backends on ports of 127.0.0.1, in this one process; prints their ports and runs
    until killed."""
    exposition = Exposition()
    steps: dict[tuple[int, str, str], Iterator[int]] = {}

    async def metrics(request: web.Request) -> web.Response:
        workload = request.match_info["workload"]
        names = parse_qs(request.query_string).get("name[]")
        if workload.startswith("unfiltered"):
            names = None
        answers = exposition.answers(workload, tuple(names) if names else None)
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        port = sockname[1] if sockname else 0
        key = port, workload, request.query_string
        if key not in steps:
            steps[key] = itertools.count(port * 7)
        body = answers[next(steps[key]) % CYCLE]
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/{workload}/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sites = [web.TCPSite(runner, "127.0.0.1", 0) for _ in range(count)]
    for site in sites:
        await site.start()
    ports = [addr[1] for addr in runner.addresses]
    print(" ".join(map(str, ports)), flush=True)
    await asyncio.Event().wait()


@contextlib.contextmanager
def backends(count: int) -> Iterator[list[int]]:
    server = subprocess.Popen([sys.executable, "-m", "loadtest.bench_scrape", "--serve",
                               str(count)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        ports = [int(p) for p in server.stdout.readline().split()]
        if len(ports) != count:
            raise SystemExit("the backends' process did not start")
        yield ports
    finally:
        server.kill()
        server.wait()


# The poller's process.


async def poll(variant: Variant, urls: list[str], warmup: float, seconds: float) -> dict[str, Any]:
    specs = [BackendSpec(id=f"b{i}", url=url) for i, url in enumerate(urls)]
    fleet = Fleet(specs, max_snapshot_age=1.0)
    async with contextlib.AsyncExitStack() as stack:
        session = None
        if variant.aiohttp:
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("Accept-Encoding",)))
        poller = Poller(fleet, session=session, interval=INTERVAL, full_every=variant.full_every,
                        templates=variant.templates, series_equal=variant.series_equal)
        await stack.enter_async_context(poller.running())
        await asyncio.sleep(warmup)
        ok0, failed0 = poller.scrapes_ok, poller.scrapes_failed
        usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        await asyncio.sleep(seconds)
        usage1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        ok, failed = poller.scrapes_ok - ok0, poller.scrapes_failed - failed0
    cpu = usage1.ru_utime - usage0.ru_utime + usage1.ru_stime - usage0.ru_stime
    wall = wall1 - wall0
    return {"share": cpu / wall, "scrapes": ok / wall, "failed": failed / wall,
            "healthy": sum(fleet.is_healthy(spec.id, time.monotonic()) for spec in specs)}


def measure(name: str, urls: list[str], warmup: float, seconds: float,
            baseline: str | None = None) -> dict[str, Any]:
    """One measurement, in a process of its own; "baseline" is the as-is poller of the source
    tree at `baseline` (its own loadtest/bench_scrape.py runs it)."""
    tree = baseline if name == "baseline" else None
    out = subprocess.run(
        [sys.executable, "-m", "loadtest.bench_scrape", "--poll",
         "as-is" if name == "baseline" else name, "--warmup", str(warmup),
         "--seconds", str(seconds), "--urls", ",".join(urls)],
        capture_output=True, text=True, check=True, cwd=tree,
        env={**os.environ, "PYTHONPATH": tree} if tree else None)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# The run.


def run(args: argparse.Namespace) -> list[Table]:
    shares: dict[tuple[str, int, str], list[float]] = {}
    checks: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    with backends(max(args.backends)) as ports:
        order = list(args.variants) + (["baseline"] if args.baseline else [])
        for rep in range(args.repeats):
            for workload in args.workloads:
                for n in args.backends:
                    urls = [f"http://127.0.0.1:{p}/{workload}" for p in ports[:n]]
                    for name in order[rep % len(order):] + order[:rep % len(order)]:
                        res = measure(name, urls, args.warmup, args.seconds, args.baseline)
                        shares.setdefault((workload, n, name), []).append(res["share"])
                        checks.setdefault((workload, n, name), []).append(res)
                        print(f"  round {rep + 1} {workload:<5}{n:>4} {name:<20}"
                              f"{res['share']:7.2%}  {res['scrapes']:7.0f} scrapes/s"
                              f"  {res['failed']:.1f} failed/s  healthy {res['healthy']}/{n}",
                              flush=True)
    tables = []
    for workload in args.workloads:
        rows = []
        for name in list(args.variants) + (["baseline"] if args.baseline else []):
            row: list[Any] = [name]
            for n in args.backends:
                median = statistics.median(shares[workload, n, name])
                base = statistics.median(shares[workload, n, "as-is"]) if (
                    workload, n, "as-is") in shares else None
                row.append(round(100 * median, 2))
                row.append("" if base is None or name == "as-is"
                           else round(100 * (median - base), 2))
                row.append(round(statistics.median(
                    r["scrapes"] for r in checks[workload, n, name])))
            rows.append(row)
        columns = ["variant"] + [c for n in args.backends for c in (
            f"{n}: % core", f"{n}: saved", f"{n}: scrapes/s")]
        tables.append(Table(
            f"Poller CPU, {workload} vLLM backends every {INTERVAL * 1000:.0f} ms",
            columns, rows,
            notes=(f"Median of {args.repeats} interleaved runs of {args.seconds:g} s each "
                   "(process CPU time of the poller's process, % of one core). 'saved': what "
                   "the piece the variant takes out saves, in points of a core: the variant's "
                   "median minus the poller's as it is. 'scrapes/s': the median rate of scrapes "
                   f"done (the schedule asks for N / {INTERVAL:g} s); a variant that falls short "
                   "of it could not keep up, and its CPU share understates its cost."
                   + (f" 'baseline': the as-is poller of {args.baseline_name}."
                      if args.baseline else ""))))
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_scrape", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    parser.add_argument("--backends", type=ints, default=[8, 64, 256])
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per run")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR",
                        help="a source tree whose as-is poller runs beside, as 'baseline'")
    parser.add_argument("--baseline-name", default="the baseline tree",
                        help="what the baseline is, for the table's notes")
    parser.add_argument("--no-record", dest="record", action="store_false")
    parser.add_argument("--record-name", default="bench_scrape",
                        help="the record's name: loadtest/results/<name>.json")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--poll", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--urls", type=lambda s: s.split(","), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        uvloop.run(serve(args.serve))
        return 0
    if args.poll:
        result = uvloop.run(poll(VARIANTS[args.poll], args.urls, args.warmup, args.seconds))
        print(json.dumps(result))
        return 0
    if unknown := set(args.variants) - set(VARIANTS):
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    if unknown := set(args.workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load averages at start: {load}", flush=True)
    tables = run(args)
    for table in tables:
        print(f"\n{table.title}\n  " + " | ".join(table.columns))
        for row in table.rows:
            print("  " + " | ".join(str(x) for x in row))
    if args.record:
        command = "python -m loadtest.bench_scrape " + shlex.join(
            sys.argv[1:] if argv is None else argv)
        path = record(args.record_name, title="What each piece of the scrape stack saves",
                      command=command.strip(), tables=tables)
        print(f"recorded in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
