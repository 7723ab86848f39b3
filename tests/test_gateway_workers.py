"""`kvgate serve --workers 2` as a process over a loopback upstream: both workers answer on
the one port, the host's ledger counts every worker's requests in flight, each backend is
scraped once per interval for the host, `/metrics` sums the workers, a killed worker is
restarted, and SIGTERM drains every worker before the supervisor exits 0."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from gateway.workers.worker import WORKER_HEADER
from tests.upstreams import FaultyUpstream, chat
from tests.waiting import until

START_S = 120.0  # two spawned workers import the gateway afresh: slow on a loaded host
POLL_S = 0.2
HELD = 16  # connections: SO_REUSEPORT spreads them; all on one worker has odds of 2**-15


@dataclass
class Gateway:
    process: asyncio.subprocess.Process
    url: str
    stderr: Path

    def workers(self) -> list[int]:
        """The pids of the supervisor's worker processes (not its resource tracker)."""
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [int(c) for c in children if b"spawn_main" in _cmdline(int(c))]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return b""


@asynccontextmanager
async def workers_over(upstream: FaultyUpstream, tmp: Path) -> AsyncIterator[Gateway]:
    out, err = tmp / "stdout", tmp / "stderr"
    env = {**os.environ, "KVGATE_ROUTING__POLL_INTERVAL_S": str(POLL_S),
           "KVGATE_SERVER__DRAIN_GRACE_S": "0.2", "KVGATE_SERVER__SHUTDOWN_TIMEOUT_S": "10"}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "serve", "--backend", upstream.url,
            "--port", "0", "--workers", "2", "--log-level", "info",
            stdout=stdout, stderr=stderr, env=env)
    url = ""

    def ready() -> bool:
        nonlocal url
        assert process.returncode is None, err.read_text()
        for line in out.read_text().splitlines():
            if line.startswith("kvgate serve: http://"):
                url = line.split()[2].removesuffix("/v1")
        return bool(url)

    try:
        await until(ready, "the supervisor says the workers serve", START_S)
        yield Gateway(process, url, err)
    finally:
        if process.returncode is None:  # SIGTERM: the supervisor removes its shared segment
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 60.0)
            except TimeoutError:
                process.kill()
                await process.wait()


async def get(url: str, path: str) -> tuple[str, aiohttp.ClientResponse, bytes]:
    """On a connection of its own: SO_REUSEPORT may give it to either worker."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, \
            http.get(url + path) as resp:
        return resp.headers[WORKER_HEADER], resp, await resp.read()


async def held_requests(url: str, count: int) -> list[asyncio.Task[tuple[int, str]]]:
    async def one() -> tuple[int, str]:
        async with aiohttp.ClientSession() as http, \
                http.post(url + "/v1/chat/completions", json=chat(False)) as resp:
            await resp.read()
            return resp.status, resp.headers[WORKER_HEADER]

    return [asyncio.ensure_future(one()) for _ in range(count)]


def metric(text: bytes, prefix: str) -> float:
    return sum(float(line.rsplit(b" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix.encode()))


async def test_two_workers_serve_as_one_gateway(tmp_path: Path) -> None:
    upstream = FaultyUpstream()
    await upstream.start()
    try:
        async with workers_over(upstream, tmp_path) as gw:
            upstream.mode = "hold"
            tasks = await held_requests(gw.url, HELD)
            seen: dict[str, int] = {}

            async def every_worker_counts_all() -> bool:
                worker, _, body = await get(gw.url, "/admin/backends")
                seen[worker] = orjson.loads(body)["backends"][0]["inflight"]
                return len(seen) == 2 and all(n == HELD for n in seen.values())

            await until(every_worker_counts_all, f"both workers' ledgers read {HELD} in flight")
            upstream.release.set()
            upstream.mode = "ok"
            answers = await asyncio.gather(*tasks)
            assert {status for status, _ in answers} == {200}
            assert {worker for _, worker in answers} == {"0", "1"}  # both took requests

            async def metrics_sum_both() -> bool:
                _, _, body = await get(gw.url, "/metrics")
                return metric(body, "gen_ai_server_request_duration_seconds_count") == HELD

            await until(metrics_sum_both, f"/metrics counts all {HELD} requests")

            # Scrapes: once per interval for the host, not once per worker.
            before = upstream.paths.count("/metrics")
            await asyncio.sleep(3.0)
            scrapes = upstream.paths.count("/metrics") - before
            assert 1 <= scrapes <= 3.0 / POLL_S + 3  # two pollers would make ~2 * 15
    finally:
        await upstream.stop()


async def test_a_killed_worker_is_restarted_and_sigterm_drains_every_worker(
        tmp_path: Path) -> None:
    upstream = FaultyUpstream()
    await upstream.start()
    try:
        async with workers_over(upstream, tmp_path) as gw:
            await until(lambda: len(gw.workers()) == 2, "two workers")
            first = gw.workers()
            os.kill(first[0], signal.SIGKILL)
            await until(lambda: len(gw.workers()) == 2 and first[0] not in gw.workers(),
                        "the killed worker replaced", START_S)
            answered: set[str] = set()

            async def both_answer() -> bool:
                worker, resp, _ = await get(gw.url, "/v1/models")
                assert resp.status == 200
                answered.add(worker)
                return answered == {"0", "1"}

            await until(both_answer, "both workers answer again", START_S)

            upstream.mode = "hold"
            tasks = await held_requests(gw.url, HELD)
            await until(lambda: upstream.calls == HELD, "every request reached the upstream")
            gw.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)  # past the drain grace: the requests are still held
            assert gw.process.returncode is None
            upstream.release.set()
            answers = await asyncio.gather(*tasks)
            assert {status for status, _ in answers} == {200}  # drained, not cut
            assert await asyncio.wait_for(gw.process.wait(), 30.0) == 0
            assert "restarting" in gw.stderr.read_text()
    finally:
        await upstream.stop()
