"""The gateway's CPU time per request with telemetry on and off, side by side in one run.

    .venv/bin/python -m loadtest.bench_gateway_telemetry [--requests 500] [--rounds 5]
        [--concurrency 16] [--time-scale 1000] [--no-record]

Layout, loopback only: one simulated backend (`kvgate sim`) and the load generator each run in a
process of their own; this process runs four gateways in front of that backend, identical but for
telemetry:

    bare  nothing recorded (Telemetry.request_finished replaced by a no-op): the baseline
    off   telemetry off as configured: no tracing, no access log; the metrics are always on
    log   + the JSON access log for every request (the CLI's batching handler, into /dev/null)
    on    + tracing every request (a BatchSpanProcessor into an exporter that discards)
    on10  the same, but 10% of the traces sampled (access log still 100%)

Each round sends the same bounded load (a mix of 3 streamed requests with usage to 1 JSON one,
16 output tokens) to each gateway in turn, the order rotating every round, and reads this
process's CPU time (`time.process_time`, every thread) around it. Only the loaded gateway works
meanwhile, so that CPU is its cost: the backend poller, whose cost per second is the same with or
without telemetry, scrapes every 5 s here (snapshots count as fresh for 60 s) so that it does not
blur the per-request figure, and the span processor is flushed inside the phase that made the
spans. Reported: the median over the rounds of CPU microseconds per request, and each config's
overhead over `bare` and over `off` as the median of the per-round ratios (a round's phases run
back to back, so slow drift of the machine cancels out), with its interquartile range. The table
goes to `loadtest/results/bench_gateway_telemetry.json` (`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from gateway.app import create_app
from gateway.config import Settings
from gateway.keys import TELEMETRY
from gateway.logsink import configure_access_log
from gateway.telemetry import RequestOutcome, RequestTiming, RequestTrace
from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
MAX_REQUESTS = 20_000  # per phase: the run stays bounded
OUTPUT_TOKENS = 16


class DiscardExporter(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


@dataclass(frozen=True, slots=True)
class Config:
    name: str
    telemetry: dict[str, Any]
    tracing: bool = False
    record: bool = True


CONFIGS = (
    Config("bare", {"access_log_sample_rate": 0.0}, record=False),
    Config("off", {"access_log_sample_rate": 0.0}),
    Config("log", {"access_log_sample_rate": 1.0}),
    Config("on", {"access_log_sample_rate": 1.0, "trace_sample_ratio": 1.0}, tracing=True),
    Config("on10", {"access_log_sample_rate": 1.0, "trace_sample_ratio": 0.1}, tracing=True),
)


def _record_nothing(timing: RequestTiming, outcome: RequestOutcome, trace: RequestTrace) -> None:
    return None


@dataclass(slots=True)
class Gateway:
    config: Config
    url: str
    processor: BatchSpanProcessor | None
    exporter: DiscardExporter


@asynccontextmanager
async def running(config: Config, backend: str) -> AsyncIterator[Gateway]:
    settings = Settings.model_validate({
        "server": {"port": 0},
        "backends": [{"url": backend}],
        "routing": {"poll_interval_s": 5.0, "max_snapshot_age_s": 60.0},
        "telemetry": config.telemetry,
    })
    exporter = DiscardExporter()
    processor = BatchSpanProcessor(exporter) if config.tracing else None
    app = create_app(settings, span_processor=processor)
    if not config.record:
        # The baseline: everything the gateway does per request except recording it.
        setattr(app[TELEMETRY], "request_finished", _record_nothing)  # noqa: B010
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield Gateway(config, f"http://{host}:{port}", processor, exporter)
    finally:
        await runner.cleanup()


class Child:
    """A helper process speaking one JSON line per command on stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(orjson.dumps(command) + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the load generator exited")
        answer: dict[str, Any] = orjson.loads(line)
        return answer


def cpu_split() -> tuple[set[int], set[int]]:
    """With two CPUs or more: the first for the gateways, the others for the backend and the
    load, so that they do not take turns on one CPU (which shows in CPU time as cache misses).
    Empty sets: no pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else (set(), set())


@asynccontextmanager
async def child(cpus: set[int], *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def start_sim(stack: AsyncExitStack, time_scale: float, cpus: set[int]) -> str:
    proc = await stack.enter_async_context(child(
        cpus, "-m", "loadtest.sim.cli", "--port", "0", "--time-scale", str(time_scale)))
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    url = line.rsplit(" on ", 1)[-1].strip()
    if not url.startswith("http://127.0.0.1:"):
        raise RuntimeError(f"the simulator did not start: {line!r}")
    return url


async def phase(gateway: Gateway, load: Child, requests: int, concurrency: int) -> float:
    """CPU seconds this process spent while `gateway` served `requests`."""
    cpu = time.process_time()
    answer = await load.ask({"url": gateway.url, "requests": requests,
                             "concurrency": concurrency})
    if gateway.processor is not None:
        gateway.processor.force_flush()
    spent = time.process_time() - cpu
    if answer["failed"]:
        raise RuntimeError(f"{gateway.config.name}: {answer['failed']} requests failed")
    return spent


async def bench(args: argparse.Namespace) -> dict[str, list[float]]:
    sink = open(os.devnull, "w")  # noqa: SIM115 - closed below
    handler = configure_access_log("info", sink)
    results: dict[str, list[float]] = {c.name: [] for c in CONFIGS}
    try:
        async with AsyncExitStack() as stack:
            gateway_cpus, other_cpus = cpu_split()
            if gateway_cpus:
                os.sched_setaffinity(0, gateway_cpus)
            backend = await start_sim(stack, args.time_scale, other_cpus)
            gateways = [await stack.enter_async_context(running(c, backend)) for c in CONFIGS]
            load = Child(await stack.enter_async_context(
                child(other_cpus, "-m", "loadtest.bench_gateway_telemetry", "--load-worker")))
            for gateway in gateways:  # warm-up: connections, caches, first-use paths
                await phase(gateway, load, max(args.requests // 5, 20), args.concurrency)
            for round_ in range(args.rounds):
                shift = round_ % len(gateways)
                for gateway in gateways[shift:] + gateways[:shift]:
                    spent = await phase(gateway, load, args.requests, args.concurrency)
                    results[gateway.config.name].append(spent / args.requests * 1e6)
            spans = next(g for g in gateways if g.config.name == "on").exporter.spans
    finally:
        handler.close()
        sink.close()
    expected = args.rounds * args.requests + max(args.requests // 5, 20)
    if spans < expected:
        raise RuntimeError(f"tracing exported {spans} spans for {expected} requests")
    return results


# The load generator (its own process).


def request_body(i: int) -> tuple[bytes, bool]:
    stream = i % 4 != 3
    body: dict[str, Any] = {
        "model": MODEL, "max_tokens": OUTPUT_TOKENS, "stream": stream,
        "messages": [{"role": "user", "content": f"request {i}: how do KV caches work?"}],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body), stream


async def send(http: aiohttp.ClientSession, url: str, requests: int, concurrency: int
               ) -> tuple[int, int]:
    bodies = [request_body(i) for i in range(requests)]
    queue: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()
    for item in bodies:
        queue.put_nowait(item)
    failed = 0

    async def worker() -> None:
        nonlocal failed
        while not queue.empty():
            body, _ = queue.get_nowait()
            async with http.post(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"}) as response:
                await response.read()
                failed += response.status != 200

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests - failed, failed


async def load_worker() -> None:
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        while line := await loop.run_in_executor(None, sys.stdin.buffer.readline):
            command = orjson.loads(line)
            requests = min(int(command["requests"]), MAX_REQUESTS)
            ok, failed = await send(http, command["url"], requests, int(command["concurrency"]))
            sys.stdout.buffer.write(orjson.dumps({"ok": ok, "failed": failed}) + b"\n")
            sys.stdout.flush()


def paired(results: dict[str, list[float]], name: str, base: str) -> tuple[float, float, float]:
    """Median and quartiles of `name`'s overhead over `base`, round by round: a round's phases
    run back to back, so the machine's drift cancels out of each ratio."""
    ratios = sorted(a / b - 1.0 for a, b in zip(results[name], results[base], strict=True))
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    low, _, high = statistics.quantiles(ratios, n=4)
    return statistics.median(ratios), low, high


def table(results: dict[str, list[float]]) -> Table:
    rows: list[list[object]] = []
    for name, values in results.items():
        cells: list[object] = []
        for base in ("bare", "off"):
            mid, low, high = paired(results, name, base)
            cells += [f"{mid:+.1%}", f"{low:+.1%} .. {high:+.1%}"]
        rows.append([name, round(statistics.median(values), 1), *cells])
    return Table("Gateway CPU per request, by telemetry configuration",
                 ["config", "CPU µs/request", "vs bare", "vs bare, IQR", "vs off", "vs off, IQR"],
                 rows, "Overheads are the median of the per-round ratios, with their "
                 "interquartile range; `bare` records nothing, `off` is telemetry off as "
                 "configured (metrics only).")


def report(results: dict[str, list[float]], args: argparse.Namespace) -> None:
    print(f"gateway CPU per request: {args.rounds} rounds x {args.requests} requests per config,"
          f" concurrency {args.concurrency}, 3 streamed : 1 JSON, {OUTPUT_TOKENS} output tokens,"
          f" {args.loop}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print("overheads: median of the per-round ratios [interquartile range]")
    print(f"{'config':<6} {'CPU us/req':>10} {'min':>7} {'max':>7}"
          f" {'vs bare':>24} {'vs off':>24}")
    for name, values in results.items():
        cells = []
        for base in ("bare", "off"):
            mid, low, high = paired(results, name, base)
            cells.append(f"{mid:+6.1%} [{low:+6.1%}, {high:+6.1%}]")
        print(f"{name:<6} {statistics.median(values):>10.1f} {min(values):>7.1f}"
              f" {max(values):>7.1f} {cells[0]:>24} {cells[1]:>24}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_gateway_telemetry")
    parser.add_argument("--requests", type=int, default=250, help="per config and round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=1000.0,
                        help="the simulator's speed-up over the modeled GPU")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the gateways' event loop (kvgate serve runs uvloop)")
    parser.add_argument("--load-worker", action="store_true", help=argparse.SUPPRESS)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.load_worker:
        asyncio.run(load_worker())
        return 0
    if not 1 <= args.requests <= MAX_REQUESTS or args.rounds < 1 or args.concurrency < 1:
        parser.error(f"need 1 <= --requests <= {MAX_REQUESTS}, --rounds >= 1, --concurrency >= 1")
    factory = uvloop.new_event_loop if args.loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        results = runner.run(bench(args))
    report(results, args)
    save(args, "bench_gateway_telemetry", title="Gateway CPU per request, telemetry on and off",
         command=command("loadtest.bench_gateway_telemetry",
                         sys.argv[1:] if argv is None else argv),
         tables=[table(results)],
         notes=f"{args.rounds} rounds x {args.requests} requests per configuration, concurrency "
               f"{args.concurrency}, 3 streamed : 1 JSON, {OUTPUT_TOKENS} output tokens, "
               f"{args.loop}; the gateways share one process, the backend and the load generator "
               "run in processes of their own on the other cores.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
