"""What watching the fleet costs: metrics parse time per payload, and the poller's CPU share.

    .venv/bin/python -m loadtest.bench_parse [--backends 32] [--interval 0.1] [--seconds 10]
                                             [--group-size 32] [--full-every N]
                                             [--loop uvloop|asyncio]
                                             [--payloads same,idle,busy]
                                             [--servers filtered,unfiltered] [--no-aiohttp]
                                             [--fixtures DIR]

1. Parse cost per payload: `parse_metrics` on each fixture payload (and on prometheus_client's
   answer to the poller's name[] query for the vLLM V1 one), format auto-detected and
   configured, and `read_metrics` alone (cutting out the series the format reads, without
   parsing them). Best of several rounds of thread CPU time, in microseconds per payload.
2. Poller CPU share: `--backends` aiohttp servers on 127.0.0.1, all in one subprocess, serving
   the vLLM V1 fixture (~50 KB, ~500 lines) at /metrics; this process runs the real `Poller`
   against them at `--interval` (on uvloop, as the gateway does; formats auto-detected) and
   measures its own CPU time (user + system, from getrusage) over `--seconds`, after a warm-up.
   The share is CPU seconds per wall second: 100% is one core; the target is under 5%.
   (loadtest/bench_scrape.py measures each piece of the scrape stack, side by side.)
   Two kinds of server (`--servers`):
   - filtered: what vLLM serves. prometheus_client's own exposition over a registry holding
     the fixture's families, one collector per family as vLLM registers them
     (`fixture_registry`), so `/metrics?name[]=...` gets only the samples asked for (~3 KB).
     Its answers are rendered once per query and step, then replayed (`Exposition` says why).
     The poller reads plain /metrics once, detects vLLM, then scrapes the filtered path
     (routing/metrics/query.py); the "name[]" column is the share of scrapes that asked for it.
     Between its scrapes of every name (about one a second), it asks for the moving series only
     (the tiers of routing/poller.py): the "hot" column. A hot answer that differs from the
     last one parsed whole only in its numbers is read from them (routing/metrics/template.py):
     the "numbers" column.
   - unfiltered: a server that ignores the query (as TGI, TensorRT-LLM and llama.cpp do, and
     vLLM versions whose own /metrics route shadows prometheus_client's): the fixture's bytes
     at every scrape, whatever the query. The poller still asks (name[] 100%) and reads the
     whole payload.
   Three kinds of payload:
   - same: the same bytes at every scrape (an idle simulator).
   - idle: the process CPU counter changes at every scrape, the load series do not (an idle
     real server); filtered, the answer holds no process series, so it is "same" again.
   - busy: running, KV usage and a counter change at every scrape: a parse every time, or, for a
     filtered hot answer, its numbers read into the last snapshot's load figures.
   `--group-size` backends are scraped in the same instant (see routing/poller.py). The servers'
   CPU is not counted, but the filter saves theirs too: the last line of part 1 is what
   prometheus_client takes to render the whole vLLM V1 payload and the name[] answer.
3. For reference, the same GETs through a bare aiohttp loop, no parsing, no poller.
Other processes on the machine disturb the figures (caches, scheduling): the load averages are
printed before and after; run it a few times and quote the range.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import itertools
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import parse_qs

import aiohttp
import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from routing.fleet import Fleet
from routing.metrics import parse_metrics, read_metrics
from routing.metrics.query import SAMPLE_NAMES
from routing.poller import Poller
from routing.state import BackendSpec

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
PAYLOADS = (  # file, configured format
    ("vllm-v1.prom", "vllm"),
    ("vllm-v0.prom", "vllm-v0"),
    ("sglang.prom", "sglang"),
    ("tgi.prom", "tgi"),
    ("llamacpp.prom", "llamacpp"),
)
TARGET_SHARE = 0.05
KINDS = ("same", "idle", "busy")
SERVERS = ("filtered", "unfiltered")
# The lines of the vLLM V1 fixture that change from scrape to scrape, by payload kind.
_CPU = "process_cpu_seconds_total 812.33"
_LABELS = '{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
_RUNNING = f"vllm:num_requests_running{_LABELS} 24.0"
_USAGE = f"vllm:kv_cache_usage_perc{_LABELS} 0.421682776801406"
_QUERIES = f"vllm:prefix_cache_queries_total{_LABELS} 1.8432e+06"


def cpu_us(fn: Callable[[], object], *, calls: int = 200, rounds: int = 15) -> float:
    """Best-of-`rounds` thread CPU time per call, in microseconds (the minimum is the cost;
    the rest is other processes disturbing the caches)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls)
    return best * 1e6


def parse_costs(fixtures: Path) -> None:
    print("parse cost per payload (thread CPU, best of 15 rounds of 200):")
    print(f"  {'payload':<15}{'bytes':>7}{'lines':>6}   {'auto-detected':>13}   {'configured':>10}"
          f"   {'read, no parse':>16}")
    rows = [(name, (fixtures / name).read_text(), fmt) for name, fmt in PAYLOADS]
    # What a vLLM server that filters answers the poller: the series read, ~2 KB.
    v1 = (fixtures / "vllm-v1.prom").read_text()
    names = SAMPLE_NAMES["vllm"]
    registry = fixture_registry(v1, "same")
    rows.insert(1, ("vllm-v1 name[]", generate_latest(registry.restricted_registry(names)).decode(),
                    "vllm"))
    for name, text, fmt in rows:
        parse = partial(parse_metrics, text, taken_at=0.0, max_batch_total_tokens=131072)
        auto = cpu_us(parse)
        configured = cpu_us(partial(parse, format=fmt))
        unchanged = cpu_us(partial(read_metrics, text, format=fmt))
        print(f"  {name:<15}{len(text):>7}{text.count(chr(10)):>6}   {auto:>10.1f} us"
              f"   {configured:>7.1f} us   {unchanged:>13.1f} us")
    whole = cpu_us(partial(generate_latest, registry), calls=20)
    filtered = cpu_us(partial(generate_latest, registry.restricted_registry(names)), calls=20)
    print(f"the server's side: prometheus_client renders the vLLM V1 payload in {whole:.0f} us, "
          f"the name[] answer in {filtered:.0f} us")


# Part 2: the servers (in a subprocess) and the poller (here).


def payloads(template: str, kind: str) -> Callable[[], bytes]:
    """The next payload of a backend serving `kind` payloads (see the module docstring)."""
    if kind == "same":
        body = template.encode()
        return lambda: body
    counter = itertools.count()
    head, rest = template.split(_CPU, 1)
    if kind == "idle":
        return lambda: f"{head}process_cpu_seconds_total {812 + next(counter) / 100}{rest}".encode()
    for line in (_RUNNING, _USAGE, _QUERIES):
        if line not in rest:
            raise SystemExit(f"the vLLM V1 fixture lacks the line {line!r}")
    pieces = rest.replace(_RUNNING, "\0").replace(_USAGE, "\0").replace(_QUERIES, "\0").split("\0")

    def busy() -> bytes:
        n = next(counter)
        values = (
            f"process_cpu_seconds_total {812 + n / 100}",
            f"vllm:num_requests_running{_LABELS} {n % 40}.0",
            f"vllm:kv_cache_usage_perc{_LABELS} {(n % 97) / 100}",
            f"vllm:prefix_cache_queries_total{_LABELS} {1843200 + 512 * n}.0",
        )
        out = [head]
        for value, piece in zip(values, pieces, strict=True):
            out += (value, piece)
        return "".join(out).encode()

    return busy


# The samples that move from scrape to scrape, by payload kind: sample name -> its value at step n.
_MOVING: dict[str, dict[str, Callable[[int], float]]] = {
    "same": {},
    "idle": {"process_cpu_seconds_total": lambda n: 812 + n / 100},
    "busy": {
        "process_cpu_seconds_total": lambda n: 812 + n / 100,
        "vllm:num_requests_running": lambda n: float(n % 40),
        "vllm:kv_cache_usage_perc": lambda n: (n % 97) / 100,
        "vllm:prefix_cache_queries_total": lambda n: 1843200.0 + 512 * n,
    },
}


class FamilyCollector:
    """One metric family as a prometheus_client collector, as each of vLLM's metrics is one
    (so a `name[]` request collects only the families asked for). A family with a moving
    sample takes one step per collection, that is per request that includes it."""

    def __init__(self, family: Metric, moving: dict[str, Callable[[int], float]]) -> None:
        self._family = family
        self._moving = {s.name: moving[s.name] for s in family.samples if s.name in moving}
        self._steps = itertools.count()

    def describe(self) -> list[Metric]:
        return [self._family]

    def collect(self) -> list[Metric]:
        if not self._moving:
            return [self._family]
        n = next(self._steps)
        moved = copy.copy(self._family)
        moved.samples = [
            s._replace(value=self._moving[s.name](n)) if s.name in self._moving else s
            for s in self._family.samples
        ]
        return [moved]


def fixture_registry(template: str, kind: str) -> CollectorRegistry:
    """A registry serving the fixture's families, their values moving as `kind` payloads do.
    A `x_created` gauge family that follows counter or histogram `x` is one of its samples in
    prometheus_client (as written by a Counter or Histogram), so it is folded back into it."""
    families: list[Metric] = []
    for family in text_string_to_metric_families(template):
        previous = families[-1] if families else None
        if (previous is not None and previous.type in ("counter", "histogram")
                and family.name == previous.name + "_created"):
            previous.samples.extend(family.samples)
        else:
            families.append(family)
    registry = CollectorRegistry()
    for family in families:
        registry.register(FamilyCollector(family, _MOVING[kind]))
    return registry


class Exposition:
    """prometheus_client's answers to `/metrics` and `/metrics?name[]=...` (read from the query
    as its ASGI and WSGI apps read it: parse_qs; `generate_latest` of the registry restricted to
    the names) over `fixture_registry`, memoised per set of names: the first `cycle` answers
    are rendered, each a step further, then served in turn. Rendering at every request would
    make these servers slower than the unfiltered ones, and a slower server spreads its
    answers over more of the poller's wake-ups, which would blur the comparison. The render
    cost itself is reported with the parse costs."""

    def __init__(self, template: str, kind: str, cycle: int = 16) -> None:
        self._registry = fixture_registry(template, kind)
        self._cycle = cycle
        self._answers: dict[tuple[str, ...] | None, list[bytes]] = {}

    def answer(self, query: str, step: int) -> bytes:
        params = parse_qs(query)
        names = tuple(params["name[]"]) if "name[]" in params else None
        answers = self._answers.get(names)
        if answers is None:
            registry = self._registry if names is None else self._registry.restricted_registry(
                names)
            answers = self._answers[names] = [generate_latest(registry)
                                              for _ in range(self._cycle)]
        return answers[step % self._cycle]


Handler = Callable[[web.Request], Awaitable[web.Response]]


def filtered_handler(exposition: Exposition) -> Handler:
    steps = itertools.count()

    async def metrics(request: web.Request) -> web.Response:
        body = exposition.answer(request.query_string, next(steps))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics


def unfiltered_handler(next_payload: Callable[[], bytes]) -> Handler:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=next_payload(), content_type="text/plain", charset="utf-8")

    return metrics


async def serve(count: int, template: str, kind: str, server: str) -> None:
    """`count` servers answering /metrics with `kind` payloads, honouring `name[]` as
    prometheus_client does (`server` "filtered") or ignoring it ("unfiltered"); prints their
    ports, runs until killed."""
    runner_sites: list[web.AppRunner] = []
    exposition = Exposition(template, kind)  # one memo for all the servers
    for _ in range(count):
        app = web.Application()
        if server == "filtered":
            app.router.add_get("/metrics", filtered_handler(exposition))
        else:
            app.router.add_get("/metrics", unfiltered_handler(payloads(template, kind)))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runner_sites.append(runner)
    print(" ".join(str(r.addresses[0][1]) for r in runner_sites), flush=True)
    await asyncio.Event().wait()


async def measure_poller(
    ports: list[int], interval: float, seconds: float, group_size: int,
    full_every: int | None = None,
) -> tuple[float, ...]:
    specs = [BackendSpec(id=f"b{i}", url=f"http://127.0.0.1:{p}") for i, p in enumerate(ports)]
    fleet = Fleet(specs, max_snapshot_age=max(1.0, 10 * interval))
    poller = Poller(
        fleet, interval=interval, timeout=max(0.5, 5 * interval), group_size=group_size,
        full_every=full_every,
    )
    async with poller.running():
        await asyncio.sleep(max(2.0, 10 * interval))  # warm-up: connections open, caches hot
        ok0, failed0 = poller.scrapes_ok, poller.scrapes_failed
        filtered0, hot0 = poller.scrapes_filtered, poller.scrapes_hot
        numbers0 = poller.scrapes_templated
        usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        await asyncio.sleep(seconds)
        usage1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        ok, failed = poller.scrapes_ok - ok0, poller.scrapes_failed - failed0
        filtered = poller.scrapes_filtered - filtered0
        hot = poller.scrapes_hot - hot0
        numbers = poller.scrapes_templated - numbers0
    healthy = sum(fleet.is_healthy(spec.id, time.monotonic()) for spec in specs)
    wall = wall1 - wall0
    user = (usage1.ru_utime - usage0.ru_utime) / wall
    system = (usage1.ru_stime - usage0.ru_stime) / wall
    return (user, system, ok / wall, failed / wall, float(healthy), filtered / max(ok, 1),
            hot / max(ok, 1), numbers / max(ok, 1))


async def measure_http_only(ports: list[int], interval: float, seconds: float) -> float:
    """The same GETs on an aiohttp session, every backend at once each interval, bodies read
    and dropped. CPU share (user + system)."""
    urls = [URL(f"http://127.0.0.1:{port}/metrics") for port in ports]

    async def get(session: aiohttp.ClientSession, url: URL) -> None:
        async with session.get(url, allow_redirects=False) as resp:
            await resp.read()

    async def ticks(session: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        start, tick = loop.time(), 0
        while True:
            await asyncio.gather(*(get(session, url) for url in urls))
            tick += 1
            await asyncio.sleep(max(0.0, start + tick * interval - loop.time()))

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("Accept-Encoding",),
    ) as session:
        task = asyncio.create_task(ticks(session))
        try:
            await asyncio.sleep(max(2.0, 10 * interval))  # the poller's warm-up
            usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            await asyncio.sleep(seconds)
            usage1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    cpu = usage1.ru_utime - usage0.ru_utime + usage1.ru_stime - usage0.ru_stime
    return cpu / (wall1 - wall0)


@contextlib.contextmanager
def servers(args: argparse.Namespace, kind: str, flavour: str) -> Iterator[list[int]]:
    server = subprocess.Popen(
        [sys.executable, "-m", "loadtest.bench_parse", "--serve", str(args.backends),
         "--kind", kind, "--server", flavour, "--fixtures", str(args.fixtures)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        ports = [int(p) for p in server.stdout.readline().split()]
        if len(ports) != args.backends:
            raise SystemExit("the server subprocess did not start")
        yield ports
    finally:
        server.kill()
        server.wait()


def _verdict(share: float) -> str:
    return "met" if share < TARGET_SHARE else "MISSED"


def poller_shares(args: argparse.Namespace) -> dict[str, float]:
    run = uvloop.run if args.loop == "uvloop" else asyncio.run
    print(f"\npoller CPU share: {args.backends} backends every {args.interval * 1000:.0f} ms in "
          f"groups of {args.group_size}, vLLM V1 payload ({args.loop}, {args.seconds:.0f} s each);"
          f" target < {TARGET_SHARE:.0%} of one core")
    print("  CPU: this process (the poller); name[]: the share of scrapes that asked for only the"
          " series read; hot: for only the moving ones; numbers: hot answers read from their"
          " numbers (a template)")
    print(f"  {'server':<11}{'payloads':<9}{'CPU':>7}{'user':>8}{'system':>8}   {'target':<7}"
          f"{'scrapes/s':>10}{'failed/s':>9}{'healthy':>8}{'name[]':>8}{'hot':>6}{'numbers':>9}")
    shares: dict[str, float] = {}
    for flavour in args.servers:
        for kind in args.payloads:
            with servers(args, kind, flavour) as ports:
                user, system, rate, failures, healthy, filtered, hot, numbers = run(
                    measure_poller(ports, args.interval, args.seconds, args.group_size,
                                   args.full_every)
                )
            share = shares[f"{flavour} {kind}"] = user + system
            print(f"  {flavour:<11}{kind:<9}{share:7.2%}{user:8.2%}{system:8.2%}   "
                  f"{_verdict(share):<7}{rate:10.1f}{failures:9.1f}"
                  f"{f'{healthy:.0f}/{args.backends}':>8}{filtered:8.0%}{hot:6.0%}"
                  f"{numbers:9.0%}")
    if args.aiohttp:
        with servers(args, "same", "unfiltered") as ports:
            http_only = shares["aiohttp"] = run(
                measure_http_only(ports, args.interval, args.seconds))
        print(f"  reference: the same plain GETs in a bare aiohttp loop, no parsing: "
              f"{http_only:.2%}   {_verdict(http_only)}")
    return shares


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_parse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", type=int, default=32)
    parser.add_argument("--interval", type=float, default=0.1, help="poll interval, seconds")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per run")
    parser.add_argument("--group-size", type=int, default=32,
                        help="backends scraped together (the gateway's default)")
    parser.add_argument("--full-every", type=int, default=None,
                        help="a scrape of every name each N grid points, of the moving ones in "
                             "between (default: about once a second; 1: every name every time)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--payloads", type=lambda s: s.split(","), default=list(KINDS),
                        help="comma-separated, of: " + ", ".join(KINDS))
    parser.add_argument("--servers", type=lambda s: s.split(","), default=list(SERVERS),
                        help="comma-separated, of: " + ", ".join(SERVERS))
    parser.add_argument("--no-aiohttp", dest="aiohttp", action="store_false",
                        help="skip the bare aiohttp reference")
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    parser.add_argument("--serve", type=int, metavar="N", help=argparse.SUPPRESS)  # subprocess
    parser.add_argument("--kind", choices=KINDS, default="same", help=argparse.SUPPRESS)
    parser.add_argument("--server", choices=SERVERS, default="unfiltered",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    template = (args.fixtures / "vllm-v1.prom").read_text()
    if args.serve:
        uvloop.run(serve(args.serve, template, args.kind, args.server))
        return 0
    if unknown := set(args.payloads) - set(KINDS):
        parser.error(f"unknown payload kinds: {', '.join(sorted(unknown))}")
    if unknown := set(args.servers) - set(SERVERS):
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    print(f"load averages (1, 5, 15 min) at start: {_load()}")
    parse_costs(args.fixtures)
    poller_shares(args)
    print(f"load averages (1, 5, 15 min) at end:   {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
