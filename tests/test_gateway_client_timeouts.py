"""Clients that dawdle are cut off: a request head sent a byte at a time is closed at the header
deadline, a body that never completes at the body deadline, and idle keep-alive connections (two
thousand of them, while normal requests go on being served) at the keep-alive timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
import pytest

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from tests.waiting import until

MODEL = PRESETS[DEFAULT_PRESET].model_name
HEADER_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.5
KEEPALIVE_S = 60.0  # far past CUT_WITHIN_S: only the head and body deadlines can cut
# Long enough for two thousand connections to be opened, on a host loaded by other work (10 s
# was not, once), before the first closes: aiohttp counts keep-alive from the connection opening.
IDLE_KEEPALIVE_S = 20.0
CUT_WITHIN_S = 10.0  # generous: the deadlines are under a second
IDLE_CONNECTIONS = 2000


@asynccontextmanager
async def serving(keepalive_s: float) -> AsyncIterator[str]:
    async with running_sim(time_scale=50.0) as sim:
        settings = Settings.model_validate({
            "server": {"port": 0, "client_header_timeout_s": HEADER_TIMEOUT_S,
                       "client_body_timeout_s": BODY_TIMEOUT_S,
                       "keepalive_timeout_s": keepalive_s},
            "backends": [{"url": sim}],
        })
        async with running_gateway(settings) as url:
            yield url


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    async with serving(KEEPALIVE_S) as url:
        yield url


async def _connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent until it closed the connection (a reset, when the client was still
    sending, is a close too)."""
    try:
        return await asyncio.wait_for(reader.read(), CUT_WITHIN_S)
    except ConnectionResetError:
        return b""


async def _metric(http: aiohttp.ClientSession, base: str, name: str) -> float:
    async with http.get(base + "/metrics") as resp:
        text = (await resp.read()).decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


async def test_a_head_sent_a_byte_at_a_time_is_cut_at_the_header_deadline(gateway: str) -> None:
    reader, writer = await _connect(gateway)
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000 + b"\r\n\r\n"

    async def dribble() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)

    task = asyncio.create_task(dribble())
    try:
        assert await _closed(reader) == b"", "the slow head was answered"
    finally:
        task.cancel()
        writer.close()
    async with aiohttp.ClientSession() as http:
        assert await _metric(http, gateway, "kvgate_client_timeouts_total") >= 1


async def test_a_body_that_never_completes_is_cut_at_the_body_deadline(gateway: str) -> None:
    reader, writer = await _connect(gateway)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\"")
    await writer.drain()
    try:
        await _closed(reader)  # no answer is owed: the connection is closed
    finally:
        writer.close()


async def test_idle_connections_are_served_alongside_then_closed_by_keepalive() -> None:
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    async with serving(IDLE_KEEPALIVE_S) as gateway:
        try:
            await _idle_then_closed(gateway, streams)
        finally:
            for _, writer in streams:
                writer.close()


async def _idle_then_closed(gateway: str,
                            streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
                            ) -> None:
    """Two thousand connections each ask once and idle; a completion is served meanwhile; then
    keep-alive closes them all and the gauge falls back."""
    for _ in range(IDLE_CONNECTIONS):  # each asks once, then idles on its connection
        reader, writer = await _connect(gateway)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        streams.append((reader, writer))
    async with aiohttp.ClientSession() as http:
        body = {"model": MODEL, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hello"}]}
        async with http.post(gateway + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read())["choices"]
        opened = await _metric(http, gateway, "kvgate_client_connections")
        assert opened >= IDLE_CONNECTIONS
        answered = await asyncio.gather(*(r.readuntil(b"\r\n\r\n") for r, _ in streams))
        assert all(a.startswith(b"HTTP/1.1 200") for a in answered)
        # Each reads its answer's body, then the end of the connection: keep-alive closed it.
        await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in streams)), 60)
        await until(lambda: _metric_below(http, gateway, "kvgate_client_connections", 5),
                    "the open-connection gauge fell back", timeout_s=30)


async def _metric_below(http: aiohttp.ClientSession, base: str, name: str, bound: float
                        ) -> bool:
    return await _metric(http, base, name) < bound
