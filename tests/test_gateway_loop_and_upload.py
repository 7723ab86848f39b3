"""The gateway's event loop is watched, and a big body goes upstream in slices: a backend
receives the client's exact bytes under the same Content-Length, and `/metrics` counts how late
the loop ran, in `kvgate_event_loop_lag_seconds`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from gateway.config import Settings
from gateway.serve import running_gateway
from gateway.upstream_body import SLICE_BYTES, SlicedPayload, upstream_body
from loadtest.sim.launch import running_sim
from tests.waiting import until


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[str, list[tuple[bytes, dict[str, str]]]]]:
    """A plain HTTP server that keeps every body it is sent, with its headers."""
    got: list[tuple[bytes, dict[str, str]]] = []

    async def keep(request: web.Request) -> web.Response:
        got.append((await request.read(), dict(request.headers)))
        return web.Response(text="kept")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/", keep)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/", got
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("body", [
    pytest.param(bytes(range(256)) * 40_000, id="10 MB of bytes"),
    pytest.param(bytearray(b"x" * (3 * SLICE_BYTES + 7)), id="a bytearray, a short last slice"),
])
async def test_a_big_body_arrives_whole_under_its_content_length(
        recorder: tuple[str, list[tuple[bytes, dict[str, str]]]], body: bytes) -> None:
    url, got = recorder
    sent = upstream_body(body)
    assert isinstance(sent, SlicedPayload)
    async with aiohttp.ClientSession() as http, http.post(url, data=sent) as resp:
        assert resp.status == 200
    received, headers = got[-1]
    assert received == body
    assert headers["Content-Length"] == str(len(body))
    assert "Transfer-Encoding" not in headers


def test_a_small_body_is_sent_as_it_is() -> None:
    body = b'{"model": "m"}'
    assert upstream_body(body) is body


async def test_metrics_count_the_event_loops_lateness() -> None:
    async with running_sim(time_scale=50.0) as sim:
        settings = Settings.model_validate({"server": {"port": 0}, "backends": [{"url": sim}]})
        async with running_gateway(settings) as base, aiohttp.ClientSession() as http:

            async def ticks() -> float:
                async with http.get(base + "/metrics") as resp:
                    text = await resp.text()
                lines = [line for line in text.splitlines()
                         if line.startswith("kvgate_event_loop_lag_seconds_count")]
                return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0

            await until(lambda: _more_than(ticks, 0.0), "the loop watch recorded a tick")
            first = await ticks()
            await until(lambda: _more_than(ticks, first), "the loop watch goes on ticking")


async def _more_than(read: Callable[[], Awaitable[float]], floor: float) -> bool:
    return await read() > floor
