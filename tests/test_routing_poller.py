"""The poller against real loopback servers: good, garbage, hanging, refusing, coming back.

Scrapes report freshness, never health: a backend whose /metrics fails stays in rotation once
anything reached it; only a refused connection takes it out, until a scrape reaches it again."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from routing import scrape_state
from routing.fleet import Fleet
from routing.metrics import Reading, snapshot_of
from routing.poller import Poller, retry_delay
from routing.state import BackendSnapshot, BackendSpec
from tests.paths import FIXTURES, eventually, free_port

VLLM_V1 = (FIXTURES / "vllm-v1.prom").read_bytes()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]





@contextlib.asynccontextmanager
async def serving(routes: dict[str, Handler], port: int = 0) -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1 with `routes` (path -> handler); yields its base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        await runner.cleanup()


def body(payload: bytes, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=payload, status=status, content_type="text/plain")

    return handler


class Hang:
    """A handler that never answers until released (at teardown); counts requests received."""

    def __init__(self) -> None:
        self.received = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.received += 1
        await self.release.wait()
        return web.Response(body=VLLM_V1)


def fleet_of(urls: dict[str, str], **formats: str) -> Fleet:
    specs = [BackendSpec(id=i, url=u, metrics_format=formats.get(i)) for i, u in urls.items()]
    return Fleet(specs, max_snapshot_age=5.0)


def poller(f: Fleet, timeout: float = 0.25, backoff_after: int = 2) -> Poller:
    """Fast enough that every test is over in well under a second of polling."""
    return Poller(f, interval=0.01, timeout=timeout, backoff_max=0.05, backoff_after=backoff_after)


def in_rotation(f: Fleet) -> list[str]:
    return [c.id for c in f.candidates(None, time.monotonic())]


async def test_broken_metrics_keep_a_backend_in_rotation_and_refused_ones_out_until_back() -> None:
    hang = Hang()
    refused_port = free_port()
    async with (
        serving({"/metrics": body(VLLM_V1)}) as good,
        serving({"/metrics": body(b"\x89PNG\r\n\x1a\n\x00\x00 not metrics \xff\xfe")}) as garbage,
        serving({"/metrics": hang.handle}) as hanging,
    ):
        urls = {"good": good, "garbage": garbage, "hanging": hanging,
                "refused": f"http://127.0.0.1:{refused_port}"}
        f = fleet_of(urls, threshold=2)
        for backend_id in urls:
            f.record_success(backend_id, 0.0)  # as discovery would: every backend reachable
        p = poller(f)
        async with p.running():
            await eventually(lambda: all(f.scrape_failures(i) >= 2 for i in ("garbage", "hanging"))
                             and not f.is_healthy("refused", time.monotonic()),
                             "failed scrapes of garbage and hanging, refused unreachable")
            first = f.snapshot("good")
            assert first is not None and f.snapshot("garbage") is None
            assert in_rotation(f) == ["good", "garbage", "hanging"]
            assert all(f.consecutive_failures(i) == 0 for i in urls)  # scrapes are no requests
            await eventually(lambda: f.snapshot("good") != first, "a newer snapshot of good")
            newer = f.snapshot("good")
            assert newer is not None and newer.taken_at > first.taken_at
            assert (newer.kv_total_blocks, newer.running) == (27313, 24)

            async with serving({"/metrics": body(VLLM_V1)}, port=refused_port):
                await eventually(lambda: f.is_healthy("refused", time.monotonic()),
                                 "the refusing backend back in rotation")
                restored = f.snapshot("refused")
                assert restored is not None and restored.kv_free_blocks == 15795
        hang.release.set()


async def test_a_hanging_backend_does_not_delay_the_others() -> None:
    hang = Hang()
    async with (
        serving({"/metrics": body(VLLM_V1)}) as good,
        serving({"/metrics": hang.handle}) as hanging,
    ):
        f = fleet_of({"hanging": hanging, "good": good})
        p = poller(f, timeout=5.0)
        async with p.running():
            await eventually(lambda: hang.received > 0, "the hanging backend's first scrape")
            since = time.monotonic()
            await eventually(lambda: (s := f.snapshot("good")) is not None and s.taken_at > since,
                             "a scrape of good sent after the hang began")
            seen = f.snapshot("good")
            assert seen is not None
            await eventually(lambda: (s := f.snapshot("good")) is not None
                             and s.taken_at > seen.taken_at,
                             "yet another scrape of good during the same hang")
            assert hang.received == 1 and f.scrape_failures("hanging") == 0
        hang.release.set()


@pytest.mark.parametrize(
    "handler",
    [
        pytest.param(body(b"<html><body>502 Bad Gateway</body></html>"), id="an HTML page"),
        pytest.param(body(b'{"detail": "Not Found"}', status=404), id="HTTP 404"),
        pytest.param(body(VLLM_V1, status=500), id="HTTP 500 with a metrics body"),
        pytest.param(body(b"vllm:num_requests_running oops\n"), id="a known name, no number"),
    ],
)
async def test_a_scrape_answered_badly_is_counted_and_reaches_a_backend_never_scraped(
    handler: Handler,
) -> None:
    async with serving({"/metrics": handler}) as url:
        f = fleet_of({"bad": url})
        assert not f.is_healthy("bad", time.monotonic())  # nothing reached it yet
        p = poller(f, backoff_after=3)
        async with p.running() as running:
            await eventually(lambda: running.scrapes_failed >= 4, "probes past the backoff")
            assert f.snapshot("bad") is None and running.scrapes_ok == 0
            assert f.scrape_failures("bad") == running.scrapes_failed
            assert f.is_healthy("bad", time.monotonic())


async def test_a_scrape_past_its_timeout_is_a_failure_that_leaves_health_alone() -> None:
    hang = Hang()
    errors: list[str] = []
    async with serving({"/metrics": hang.handle}) as url:
        f = fleet_of({"slow": url, "unknown": url})
        f.record_success("slow", 0.0)
        p = Poller(f, interval=0.01, timeout=0.05, backoff_max=0.05,
                   on_error=lambda b, e: errors.append(e))
        async with p.running():
            await eventually(lambda: f.scrape_failures("slow") >= 2
                             and f.scrape_failures("unknown") >= 2, "two timeouts in a row")
            assert in_rotation(f) == ["slow"]  # a timeout reaches nothing, takes nothing out
        hang.release.set()
    assert set(errors) == {"ScrapeTimeout"}


async def test_llamacpp_kv_comes_from_slots() -> None:
    routes = {
        "/metrics": body((FIXTURES / "llamacpp.prom").read_bytes()),
        "/slots": body((FIXTURES / "llamacpp-slots.json").read_bytes()),
    }
    async with serving(routes) as url:
        f = fleet_of({"llama": url})
        async with poller(f).running():
            await eventually(lambda: f.snapshot("llama") is not None, "a llama.cpp snapshot")
    snap = f.snapshot("llama")
    assert snap is not None and snap.format == "llamacpp"
    assert (snap.kv_total_blocks, snap.kv_free_blocks, snap.block_size) == (16384, 13287, 1)


async def test_llamacpp_with_slots_disabled_still_has_a_snapshot_without_kv() -> None:
    routes = {
        "/metrics": body((FIXTURES / "llamacpp.prom").read_bytes()),
        "/slots": body(b'{"error": {"code": 501, "message": "This server does not support slots'
                       b' endpoint."}}', status=501),
    }
    async with serving(routes) as url:
        f = fleet_of({"llama": url}, llama="llamacpp")
        async with poller(f).running():
            await eventually(lambda: f.snapshot("llama") is not None, "a llama.cpp snapshot")
    snap = f.snapshot("llama")
    assert snap is not None and f.is_healthy("llama", time.monotonic())
    assert (snap.kv_total_blocks, snap.running, snap.waiting) == (None, 2, 1)


async def test_a_session_passed_in_is_used_and_left_open() -> None:
    async with serving({"/metrics": body(VLLM_V1)}) as url, aiohttp.ClientSession() as session:
        f = fleet_of({"a": url})
        async with Poller(f, session=session, interval=0.01).running():
            await eventually(lambda: f.snapshot("a") is not None, "a snapshot")
        assert not session.closed


async def test_the_snapshot_is_stamped_with_the_clock_read_just_before_the_request() -> None:
    now = [0.0]
    seen: list[float] = []

    async def metrics(request: web.Request) -> web.Response:
        now[0] += 1.0  # the clock moves on while the server answers
        seen.append(now[0])
        return web.Response(body=VLLM_V1)

    async with serving({"/metrics": metrics}) as url:
        f = fleet_of({"a": url})
        async with Poller(f, interval=0.01, clock=lambda: now[0]).running():
            await eventually(lambda: f.snapshot("a") is not None, "a snapshot")
    snap = f.snapshot("a")
    assert snap is not None and snap.taken_at + 1.0 in seen


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 0.1), (2, 0.1), (3, 0.2), (4, 0.4), (5, 0.8), (9, 5.0), (10_000, 5.0)],
    ids=["answering", "failing, not yet backed off", "just backed off: doubled", "doubled again",
         "and again", "capped", "capped after very many"],
)
def test_backends_whose_scrapes_fail_are_probed_with_exponential_backoff(
    failures: int, delay: float
) -> None:
    assert retry_delay(0.1, failures, 3, 5.0) == pytest.approx(delay)


async def test_every_failed_scrape_is_reported_by_backend_and_error_class() -> None:
    errors: list[tuple[str, str]] = []
    async with serving({"/metrics": body(b"<html>no</html>")}) as url:
        f = fleet_of({"html": url, "refused": f"http://127.0.0.1:{free_port()}"})
        p = Poller(f, interval=0.01, on_error=lambda b, e: errors.append((b, e)))
        async with p.running():
            await eventually(lambda: len(set(errors)) == 2, "a failure from each backend")
    assert set(errors) == {("html", "MetricsError"), ("refused", "ScrapeConnectError")}
    assert len(errors) == p.scrapes_failed


def changing(make: Callable[[int], bytes]) -> Handler:
    """A /metrics handler answering `make(n)` to its n-th request."""
    count = itertools.count()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=make(next(count)), content_type="text/plain")

    return handler


RUNNING_24 = (b'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
              b" 24.0")


@pytest.mark.parametrize(("series_equal", "parsed_once"), [
    pytest.param(True, True, id="load series unchanged: the last snapshot, restamped"),
    pytest.param(False, False, id="series-equal reuse off: parsed at every scrape"),
])
async def test_an_idle_backend_is_not_parsed_again_and_stays_fresh(
    monkeypatch: pytest.MonkeyPatch, series_equal: bool, parsed_once: bool,
) -> None:
    """A whole payload whose process CPU moves at every scrape while its load series do not."""
    parsed: list[float] = []

    def counting_snapshot_of(reading: Reading, **kwargs: Any) -> BackendSnapshot:
        parsed.append(kwargs["taken_at"])
        return snapshot_of(reading, **kwargs)

    monkeypatch.setattr(scrape_state, "snapshot_of", counting_snapshot_of)
    cpu = b"process_cpu_seconds_total 812.33"
    idle = changing(lambda n: VLLM_V1.replace(cpu, f"process_cpu_seconds_total {812 + n}".encode()))
    async with serving({"/metrics": idle}) as url:
        f = fleet_of({"idle": url})
        p = Poller(f, interval=0.01, timeout=0.25, backoff_max=0.05, series_equal=series_equal)
        async with p.running():
            await eventually(lambda: p.scrapes_ok >= 5, "five scrapes")
            snap, ok = f.snapshot("idle"), p.scrapes_ok
    assert len(parsed) == (1 if parsed_once else ok)
    assert snap is not None and snap.taken_at > parsed[0]
    assert (snap.running, snap.kv_free_blocks) == (24, 15795)


async def test_a_busy_backend_is_read_afresh_at_every_scrape() -> None:
    busy = changing(lambda n: VLLM_V1.replace(RUNNING_24, RUNNING_24[:-4] + f"{n}.0".encode()))
    seen: list[int] = []
    async with serving({"/metrics": busy}) as url:
        f = fleet_of({"busy": url})
        async with poller(f).running():
            def three_distinct() -> bool:
                snap = f.snapshot("busy")
                if snap is not None and snap.running is not None and snap.running not in seen:
                    seen.append(snap.running)
                return len(seen) >= 3

            await eventually(three_distinct, "three readings of running")
    assert seen == sorted(seen)


async def test_an_https_backend_is_scraped_through_aiohttp() -> None:
    """The keep-alive client speaks plain http only; TLS goes through an aiohttp session of the
    poller's own. Against a plain-http server the TLS handshake fails: a connect error."""
    errors: list[str] = []
    async with serving({"/metrics": body(VLLM_V1)}) as url:
        f = fleet_of({"tls": url.replace("http://", "https://")})
        p = Poller(f, interval=0.01, backoff_max=0.05, on_error=lambda b, e: errors.append(e))
        async with p.running():
            await eventually(lambda: len(errors) >= 2, "two failed scrapes")
    assert set(errors) == {"ScrapeConnectError"} and f.snapshot("tls") is None
