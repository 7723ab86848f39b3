"""The gateway under faults, timed: what the fault-injection rows (tests/test_faults_*.py) check
for behaviour, measured here for time.

    python -m loadtest.bench_reliability [--requests 200] [--concurrency 8] [--idle 2000]
        [--loris 50] [--rounds 2] [--no-record]

`kvgate sim` backends and `kvgate serve` run as subprocesses on loopback (so this process's
clients, slow-loris ones included, do not share the gateway's event loop), and three figures are
taken side by side in one run:
- normal traffic's p99 latency (streamed chats, --concurrency at a time) alone, and while
  --loris connections dribble their request heads, --loris their bodies, and --idle connections
  sit open sending nothing; the rounds alternate and the ratio is of the medians. Goal: under
  1.2;
- the longest gap between two chunks of 20 running streams while one valid 30 MB body (10,000
  messages) is sent and parsed, beside the longest gap over as long a window without it. Goal:
  under 50 ms;
- recovery: from a backend's SIGKILL, SIGSTOP or restart to the gateway's routing around it
  (a request answered 200 and the backend out of rotation) or back to it (healthy in
  `/admin/backends`).
Figures depend on the host; a shared machine's load is recorded beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
import orjson
import uvloop
import yaml

from loadtest.results import Table, add_arguments, command, save

MODEL = "bench-model"
DEADLINE_S = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def _answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http, \
                http.get(url) as resp:
            return resp.status < 500
    except (aiohttp.ClientError, TimeoutError):
        return False


@contextlib.asynccontextmanager
async def _process(argv: list[str], probe: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`argv` until GET `probe` answers; thawed and killed on exit."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not await _answers(probe):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not start")
            await asyncio.sleep(0.05)
        yield proc
    finally:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        await proc.wait()


def _sim(port: int, seed: int) -> contextlib.AbstractAsyncContextManager[Any]:
    return _process([sys.executable, "-m", "gateway.cli", "sim", "--port", str(port), "--model",
                     MODEL, "--seed", str(seed)], f"http://127.0.0.1:{port}/health")


@contextlib.asynccontextmanager
async def _gateway(backends: list[int]) -> AsyncIterator[str]:
    port = _free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port, "first_byte_timeout_s": 2,
                   "stream_idle_timeout_s": 2, "client_header_timeout_s": 2,
                   "client_body_timeout_s": 2},
        "backends": [{"url": f"http://127.0.0.1:{p}", "id": f"b{i}", "models": [MODEL]}
                     for i, p in enumerate(backends)],
        "health": {"consecutive_failures": 3, "base_ejection_s": 1},
        "routing": {"policy": "round_robin", "poll_interval_s": 0.1},
        "telemetry": {"access_log_sample_rate": 0.0},
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump(config, file)
    url = f"http://127.0.0.1:{port}"
    try:
        async with _process([sys.executable, "-m", "gateway.cli", "serve", "--config",
                             file.name, "--log-level", "error"], url + "/health"):
            yield url
    finally:
        os.unlink(file.name)


def _chat(max_tokens: int, text: str = "hello") -> bytes:
    return orjson.dumps({"model": MODEL, "stream": True, "max_tokens": max_tokens,
                         "ignore_eos": True, "messages": [{"role": "user", "content": text}]})


async def _stream(http: aiohttp.ClientSession, url: str, body: bytes,
                  on_chunk: Callable[[float], None] | None = None) -> tuple[int, float]:
    """One streamed chat: (status, seconds to its end)."""
    started = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", data=body,
                         headers={"Content-Type": "application/json"}) as resp:
        async for _ in resp.content.iter_any():
            if on_chunk is not None:
                on_chunk(time.perf_counter())
        return resp.status, time.perf_counter() - started


async def _latencies(url: str, requests: int, concurrency: int) -> list[float]:
    done: list[float] = []
    todo = iter(range(requests))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def worker() -> None:
            for i in todo:
                status, took = await _stream(http, url, _chat(16, f"{i} hello"))
                if status == 200:
                    done.append(took)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def _hold_open(port: int, head: bytes, drip: bytes, stop: asyncio.Event) -> None:
    """One connection: `head`, then `drip` a byte every 0.5 s; reopened when the gateway cuts
    it, until `stop`."""
    while not stop.is_set():
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        # The gateway may cut it at any write (uvloop: "the handler is closed").
        try:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(head)
                for byte in drip * 1000:
                    if stop.is_set():
                        break
                    if drip:
                        writer.write(bytes([byte]))
                        await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)
                if not drip:
                    await stop.wait()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def p99_under_loris(url: str, args: argparse.Namespace) -> Table:
    port = int(url.rsplit(":", 1)[1])
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\n"
    body_head = head + b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
    alone: list[float] = []
    loris: list[float] = []
    await _latencies(url, args.concurrency * 4, args.concurrency)  # warm-up
    for _ in range(args.rounds):
        alone.append(_p99(await _latencies(url, args.requests, args.concurrency)))
        stop = asyncio.Event()
        holders = [asyncio.ensure_future(_hold_open(port, head, b"X-Slow: abc", stop))
                   for _ in range(args.loris)]
        holders += [asyncio.ensure_future(_hold_open(port, body_head, b'{"model"', stop))
                    for _ in range(args.loris)]
        holders += [asyncio.ensure_future(_hold_open(port, b"", b"", stop))
                    for _ in range(args.idle)]
        await asyncio.sleep(1.0)  # the connections opened
        loris.append(_p99(await _latencies(url, args.requests, args.concurrency)))
        stop.set()
        await asyncio.gather(*holders)
    a, b = statistics.median(alone), statistics.median(loris)
    return Table(
        "Normal traffic's p99 with and without slow-loris and idle connections",
        ["traffic", "p99 ms (median of rounds)", "ratio"],
        [["alone", round(a * 1e3, 1), 1.0],
         [f"with {args.loris}+{args.loris} slow-loris, {args.idle} idle",
          round(b * 1e3, 1), round(b / a, 3)]],
        notes=f"{args.requests} streamed chats of 16 tokens, {args.concurrency} at a time, per "
        f"round; {args.rounds} rounds alternating. Goal: a ratio under 1.2.")


def thirty_mb_body() -> bytes:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 3000}}
    return orjson.dumps({"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": "what do these show?"}] + [
        {"role": "user", "content": [image]} for _ in range(9_999)]})


class GapMeter:
    """The longest gap between two chunks of one stream, counted once `open` is set."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.worst = 0.0
        self.open = False

    def of(self, stream: int) -> Callable[[float], None]:
        def seen(now: float) -> None:
            if self.open and stream in self.last:
                self.worst = max(self.worst, now - self.last[stream])
            self.last[stream] = now
        return seen


async def stall_under_big_body(url: str) -> Table:
    big = thirty_mb_body()
    rows: list[list[Any]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for label, send_big in (("without the body", False), ("while the body is parsed", True)):
            meter = GapMeter()
            streams = [asyncio.ensure_future(_stream(http, url, _chat(400), meter.of(i)))
                       for i in range(20)]
            while len(meter.last) < 20:
                await asyncio.sleep(0.01)
            meter.open = True
            started = time.perf_counter()
            status: int | None = None
            if send_big:
                async with http.post(url + "/v1/chat/completions", data=io.BytesIO(big),
                                     headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    status = resp.status
            else:
                await asyncio.sleep(1.0)
            meter.open = False
            rows.append([label, round(meter.worst * 1e3, 1),
                         round(time.perf_counter() - started, 2), status])
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
    return Table("The longest stall of 20 running streams while a 30 MB body is parsed",
                 ["window", "longest gap between chunks, ms", "window s", "body's status"],
                 rows,
                 notes=f"One valid {len(big) / 1e6:.0f} MB chat (10,000 messages) sent while "
                 "20 streams run; their longest inter-chunk gap in that window, beside a 1 s "
                 "window without it. The body's status is recorded: a 429 is admission refusing "
                 "the conversation's cost, after the body was read, parsed and priced whole. "
                 "Goal: under 50 ms.")


async def _rows(url: str) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url + "/admin/backends") as resp:
        return {row["id"]: row for row in orjson.loads(await resp.read())["backends"]}


async def _probe_ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            status, _ = await _stream(http, url, _chat(2))
            return status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _time_until(check: Callable[[], Any], limit_s: float = DEADLINE_S) -> float | None:
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if await check():
            return time.perf_counter() - started
        await asyncio.sleep(0.02)
    return None


async def recovery(url: str, sims: list[Any], ports: list[int]) -> Table:
    victim = sims[0]

    async def routed_around() -> bool:
        # Out of rotation, or (metrics gone silent, chat frozen too) read as stale, so a fresh
        # backend is preferred until its own requests time out and eject it.
        out = (await _rows(url))["b0"]
        gone = (not out["healthy"] or out.get("ejected_until") is not None
                or bool(out.get("stale")))
        return gone and await _probe_ok(url)

    async def back() -> bool:
        return bool((await _rows(url))["b0"]["healthy"])

    rows: list[list[Any]] = []
    os.kill(victim.pid, signal.SIGSTOP)
    frozen = await _time_until(routed_around)
    os.kill(victim.pid, signal.SIGCONT)
    thawed = await _time_until(back)
    rows += [["frozen (SIGSTOP)", _ms(frozen)], ["thawed (SIGCONT)", _ms(thawed)]]
    victim.kill()
    await victim.wait()
    killed = await _time_until(routed_around)
    rows.append(["killed (SIGKILL)", _ms(killed)])
    async with _sim(ports[0], 0):
        restarted = await _time_until(back)
        rows.append(["restarted on its port", _ms(restarted)])
    return Table("Recovery: from a backend's fault to the gateway's routing around it or back",
                 ["fault", "recovery ms"], rows,
                 notes="Routed around: the backend out of rotation (or stale) in "
                 "/admin/backends and a request answered 200; back: healthy again. Polled "
                 "every 20 ms; first-byte timeout 2 s, poll interval 0.1 s. Empty: not within "
                 "60 s.")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 0)


async def bench(args: argparse.Namespace) -> list[Table]:
    ports = [_free_port(), _free_port()]
    async with contextlib.AsyncExitStack() as stack:
        sims = [await stack.enter_async_context(_sim(p, i)) for i, p in enumerate(ports)]
        url = await stack.enter_async_context(_gateway(ports))
        await _time_until(lambda: _probe_ok(url))
        tables = [await p99_under_loris(url, args), await stall_under_big_body(url)]
        tables.append(await recovery(url, sims, ports))
    return tables


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_reliability",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="per round and traffic")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--idle", type=int, default=2000, help="idle connections held open")
    parser.add_argument("--loris", type=int, default=50,
                        help="slow-loris connections of each kind (heads, bodies)")
    parser.add_argument("--rounds", type=int, default=2)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if min(args.requests, args.concurrency, args.rounds) < 1 or min(args.idle, args.loris) < 0:
        parser.error("--requests, --concurrency and --rounds must be >= 1, the others >= 0")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        tables = runner.run(bench(args))
    for table in tables:
        print(table.title)
        for row in table.rows:
            print("  ", *row)
    save(args, "bench_reliability", title="The gateway under faults, timed",
         command=command("loadtest.bench_reliability", sys.argv[1:] if argv is None else argv),
         tables=tables)


if __name__ == "__main__":
    main()
