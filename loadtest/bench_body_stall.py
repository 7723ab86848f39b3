"""How long one big request body stalls every other stream through the gateway, side by side.

    python -m loadtest.bench_body_stall [--streams 20] [--tokens 400] [--repeat 3] [--no-record]

A `kvgate serve` subprocess in front of two `kvgate sim` subprocesses: one serves the streams,
the other the big bodies (a different model, so that the simulator parsing a body does not
stall the streams itself). For each body, --repeat pairs of runs one after the other: --streams
streams of --tokens tokens each, alone, then again with the body posted while they run. A run's
figure is the longest gap between two chunks of any stream (what a client sees as a stall); a
body's figures are the medians over its pairs, with its answer and time. Bodies: 10,000
messages (the default `server.max_messages`), 200,000 messages (9.5 MB, refused by
max_messages) and 30 MB in four huge messages. The gateway is a separate process, and the body
is posted by another one (sending 30 MB from the streams' own event loop would stall their
reading here), so the figures are the gateway's stalls, not this client's. The bulk simulator
runs at the lowest CPU priority: it stands for a GPU server's host, whose CPU is not the
gateway's, and tokenizing 30 MB would otherwise take one of the machine's cores from it.
The table goes to `loadtest/results/bench_body_stall.json` (`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from loadtest.results import Table, add_arguments, command, save
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

ROOT = Path(__file__).resolve().parents[1]
STREAM_MODEL = PRESETS[DEFAULT_PRESET].model_name
BULK_MODEL = "bulk-body"
START_DEADLINE_S = 60.0


@dataclass(frozen=True, slots=True)
class Run:
    longest_gap_ms: float
    body_status: int | None = None
    body_ms: float | None = None
    loop_lag_ms: float | None = None  # the gateway's worst event-loop lag bucket meanwhile


@dataclass(frozen=True, slots=True)
class Fleet:
    gateway: str  # base URLs
    streams: str


def bodies() -> dict[str, bytes]:
    """The bodies posted, built before any stream starts."""
    def chat(messages: list[dict[str, str]]) -> bytes:
        return orjson.dumps({"model": BULK_MODEL, "max_tokens": 1, "messages": messages})

    huge = "lorem ipsum dolor sit amet " * (7_500_000 // 27)
    return {
        "10,000 messages": chat([{"role": "user", "content": f"message {i} of a long chat"}
                                 for i in range(10_000)]),
        "200,000 messages": chat([{"role": "user", "content": f"message {i} here"}
                                  for i in range(200_000)]),
        "30 MB in 4 messages": chat([{"role": "user", "content": huge} for _ in range(4)]),
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _lowest_priority() -> None:
    os.nice(19)


@asynccontextmanager
async def _process(args: list[str], health: str, *, niced: bool = False
                   ) -> AsyncIterator[None]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, cwd=ROOT, env=environ,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=_lowest_priority if niced else None)
    try:
        async with aiohttp.ClientSession() as http:
            end = time.monotonic() + START_DEADLINE_S
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"{' '.join(args[:1])} exited early")
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(health) as resp:
                        if resp.status == 200:
                            break
                if time.monotonic() > end:
                    raise RuntimeError(f"{health} never answered")
                await asyncio.sleep(0.1)
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@asynccontextmanager
async def fleet(time_scale: float) -> AsyncIterator[Fleet]:
    """The gateway in front of a streams simulator and a bulk one."""
    streams, bulk, gateway = _free_port(), _free_port(), _free_port()
    scale = ["--time-scale", str(time_scale)]
    async with _process(["sim", "--port", str(streams), *scale],
                        f"http://127.0.0.1:{streams}/health"), \
            _process(["sim", "--port", str(bulk), "--model", BULK_MODEL, *scale],
                     f"http://127.0.0.1:{bulk}/health", niced=True), \
            _process(["serve", "--port", str(gateway), "--log-level", "warning",
                      "--backend", f"http://127.0.0.1:{streams}/v1",
                      "--backend", f"http://127.0.0.1:{bulk}/v1"],
                     f"http://127.0.0.1:{gateway}/ready"):
        yield Fleet(f"http://127.0.0.1:{gateway}", f"http://127.0.0.1:{streams}")


async def _stream(http: aiohttp.ClientSession, base: str, tokens: int,
                  started: asyncio.Event) -> float:
    """One stream's longest gap between chunks, in seconds (from its first chunk)."""
    body = {"model": STREAM_MODEL, "stream": True, "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "tell me a long story"}]}
    longest, last = 0.0, None
    async with http.post(base + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content.iter_any():
            now = time.perf_counter()
            if last is not None:
                longest = max(longest, now - last)
            else:
                started.set()
            last = now
    return longest


LAG_METRIC = "kvgate_event_loop_lag_seconds_bucket"


async def _lag_buckets(http: aiohttp.ClientSession, gateway: str) -> dict[float, float]:
    """The gateway's event-loop lag histogram: {upper bound in s: cumulative count}."""
    async with http.get(gateway + "/metrics") as resp:
        text = await resp.text()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(LAG_METRIC + "{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(bound)] = float(line.rsplit(" ", 1)[1])
    return buckets


def worst_lag_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The upper bound (ms) of the highest bucket that counted a lag between the two readings
    (inf when the last one did), None when nothing was counted."""
    worst = None
    below = 0.0
    for bound in sorted(after):
        count = after[bound] - before.get(bound, 0.0)
        if count > below:
            worst = bound
        below = count
    return None if worst is None else worst * 1e3


async def run_once(fleet: Fleet, streams: int, tokens: int, body: bytes | None, *,
                   direct: bool = False) -> Run:
    """Streams through the gateway (`direct`: to the simulator itself, the machine's own noise
    with the body in the gateway), with `body` posted to the gateway meanwhile."""
    base = fleet.streams if direct else fleet.gateway
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        before = await _lag_buckets(http, fleet.gateway)
        flags = [asyncio.Event() for _ in range(streams)]
        tasks = [asyncio.create_task(_stream(http, base, tokens, f)) for f in flags]
        await asyncio.gather(*(f.wait() for f in flags))
        await asyncio.sleep(0.3)  # the streams are in their steady pace
        status: int | None = None
        elapsed: float | None = None
        if body is not None:
            status, elapsed = await _posted_elsewhere(fleet.gateway + "/v1/chat/completions",
                                                      body)
        gaps = await asyncio.gather(*tasks)
        lag = worst_lag_ms(before, await _lag_buckets(http, fleet.gateway))
    return Run(round(max(gaps) * 1e3, 1), status,
               None if elapsed is None else round(elapsed * 1e3, 1), lag)


async def _posted_elsewhere(url: str, body: bytes) -> tuple[int, float]:
    """(status, seconds) of `body` posted to `url` by a child process."""
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        file.write(body)
        file.flush()
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadtest.bench_body_stall", "--post", url, file.name,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE)
        out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"posting the body failed (exit {child.returncode})")
    status, seconds = out.split()
    return int(status), float(seconds)


async def _post(url: str, path: str) -> None:
    body = Path(path).read_bytes()
    async with aiohttp.ClientSession() as http:
        began = time.perf_counter()
        async with http.post(url, data=body,
                             headers={"Content-Type": "application/json"}) as resp:
            await resp.read()
        print(resp.status, time.perf_counter() - began)


async def measure(args: argparse.Namespace) -> list[list[object]]:
    rows: list[list[object]] = []
    posted = bodies()
    async with fleet(args.time_scale) as where:
        await run_once(where, args.streams, 20, None)  # warm the connections and the simulator
        print(f"{'body':22} {'MB':>6} {'status':>6} {'gap alone':>10} {'gap w/ body':>12} "
              f"{'ratio':>6} {'direct w/ body':>15} {'loop lag <=':>12} {'body ms':>8}")
        for name, body in posted.items():
            runs = [(await run_once(where, args.streams, args.tokens, None),
                     await run_once(where, args.streams, args.tokens, body),
                     await run_once(where, args.streams, args.tokens, body, direct=True))
                    for _ in range(args.repeat)]
            alone = statistics.median(a.longest_gap_ms for a, _, _ in runs)
            loaded = statistics.median(b.longest_gap_ms for _, b, _ in runs)
            direct = statistics.median(d.longest_gap_ms for _, _, d in runs)
            lags = [b.loop_lag_ms for _, b, _ in runs if b.loop_lag_ms is not None]
            lag = statistics.median(lags) if lags else 0.0
            body_ms = statistics.median(b.body_ms or 0.0 for _, b, _ in runs)
            status = runs[-1][1].body_status
            ratio = round(loaded / alone, 2)
            size = round(len(body) / 1e6, 1)
            print(f"{name:22} {size:6.1f} {status!s:>6} {alone:10.1f} {loaded:12.1f} "
                  f"{ratio:6.2f} {direct:15.1f} {lag:12.0f} {body_ms:8.1f}")
            rows.append([name, size, status, alone, loaded, ratio, direct, lag,
                         round(body_ms, 1)])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_body_stall",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=400, help="tokens per stream")
    parser.add_argument("--repeat", type=int, default=3,
                        help="pairs of runs per body; the figures are their medians")
    parser.add_argument("--post", nargs=2, metavar=("URL", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="the simulators' speed-up (1: a real GPU's pace)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.post is not None:  # the child that posts a body
        asyncio.run(_post(*args.post))
        return 0
    if args.streams < 1 or args.tokens < 20 or args.repeat < 1:
        print("--streams and --repeat must be >= 1, --tokens >= 20", file=sys.stderr)
        return 2
    rows = asyncio.run(measure(args))
    save(args, "bench_body_stall", title="One big request body against 20 running streams",
         command=command("loadtest.bench_body_stall", sys.argv[1:] if argv is None else argv),
         tables=[Table(
             f"Longest gap between two chunks of any of {args.streams} streams of "
             f"{args.tokens} tokens, alone and while one body is posted (ms)",
             ["body", "MB", "status", "gap alone", "gap with the body", "ratio",
              "gap direct, body in the gateway", "gateway loop lag at most", "body ms"],
             rows,
             "Medians over the pairs of runs, each pair measured one after the other against "
             "the same gateway; the ratio is theirs. A gap is what a client sees as a stall: "
             "the gateway's event loop busy with the body instead of relaying. The simulator "
             "refuses the valid bodies (past its context length) after the gateway forwarded "
             "them; the 200,000-message body is the gateway's own 400 (max_messages). The "
             "'gap alone' column is the machine's own noise floor; 'gap direct' is the same "
             "streams read from the simulator itself while the gateway takes the body: what "
             "the machine's cores, shared by the client, the simulators and the gateway, cost "
             "the streams without the gateway in their path. 'Gateway loop lag at most' is the "
             "upper bound of the highest `kvgate_event_loop_lag_seconds` bucket that counted "
             "during the run: the gateway's own stall.")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
