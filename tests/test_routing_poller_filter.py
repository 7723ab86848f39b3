"""The poller asks prometheus_client servers for only the series it reads (`/metrics?name[]=...`)
and goes back to plain /metrics, keeping the backend's state, when a server cannot filter.

The servers are real: prometheus_client's own exposition (its HTTP server, and its aiohttp
handler) over a registry holding the vLLM V1 fixture's families, one collector per family as
vLLM registers them (loadtest/bench_parse.py `fixture_registry`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.parser import text_string_to_metric_families

from loadtest.bench_parse import Exposition, fixture_registry
from routing.fleet import Fleet
from routing.metrics import parse_metrics, read_metrics
from routing.metrics.query import SAMPLE_NAMES, filtered_path
from routing.poller import Poller
from routing.state import BackendSnapshot, BackendSpec
from tests.paths import FIXTURES, eventually

VLLM_V1_TEXT = (FIXTURES / "vllm-v1.prom").read_text()
VLLM_V1 = VLLM_V1_TEXT.encode()
Handler = Callable[[web.Request], Any]




def expected(payload: bytes, fmt: str | None = None) -> BackendSnapshot:
    return parse_metrics(payload, taken_at=0.0, format=fmt)


def same_state(a: BackendSnapshot, b: BackendSnapshot) -> bool:
    return a._replace(taken_at=0.0) == b._replace(taken_at=0.0)


class Recorder:
    """An aiohttp /metrics handler that logs each request's query string, then answers with
    `answer` (swappable while the server runs)."""

    def __init__(self, answer: Handler) -> None:
        self.queries: list[str] = []
        self.answer = answer

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(request.query_string)
        response: web.StreamResponse = await self.answer(request)
        return response

    def filtered(self) -> list[bool]:
        return ["name" in q for q in self.queries]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def prometheus_http_server(registry: CollectorRegistry) -> Iterator[str]:
    """prometheus_client's own threaded HTTP server on a free loopback port."""
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.asynccontextmanager
async def polling(url: str, fmt: str | None = None, **kwargs: Any
                  ) -> AsyncIterator[tuple[Poller, Fleet]]:
    fleet = Fleet([BackendSpec(id="b", url=url, metrics_format=fmt)], max_snapshot_age=5.0)
    poller = Poller(fleet, interval=kwargs.pop("interval", 0.02), timeout=2.0,
                    backoff_after=kwargs.pop("threshold", 2), **kwargs)
    async with poller.running():
        yield poller, fleet


def snapshot(fleet: Fleet) -> BackendSnapshot | None:
    return fleet.snapshot("b")


def body(payload: bytes, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=payload, status=status, content_type="text/plain")

    return handler


# The query: one source of truth, decoded by prometheus_client as sent.


@pytest.mark.parametrize("family", sorted(SAMPLE_NAMES))
def test_the_filtered_path_asks_for_exactly_the_names_the_reader_reads(family: str) -> None:
    path = filtered_path(family)
    assert path is not None
    target = urlsplit(path)
    assert target.path == "/metrics"
    assert "%5B%5D=" in target.query and ":" not in target.query  # percent-encoded
    # prometheus_client's WSGI and ASGI apps read the query with parse_qs.
    assert parse_qs(target.query)["name[]"] == list(SAMPLE_NAMES[family])


def test_prometheus_client_reads_the_literal_form_the_same() -> None:
    literal = "&".join(f"name[]={name}" for name in SAMPLE_NAMES["vllm"])
    assert parse_qs(literal) == parse_qs(urlsplit(filtered_path("vllm") or "").query)


@pytest.mark.parametrize("family", ["tgi", "trtllm", "llamacpp"])
def test_formats_not_served_by_prometheus_client_are_never_filtered(family: str) -> None:
    assert filtered_path(family) is None


@pytest.mark.parametrize(("fixture", "fmt"), [
    ("vllm-v1.prom", "vllm"), ("vllm-v0.prom", "vllm-v0"), ("sglang.prom", "sglang"),
], ids=["vllm V1", "vllm V0", "sglang"])
def test_a_filtered_answer_reads_as_the_whole_payload(fixture: str, fmt: str) -> None:
    text = (FIXTURES / fixture).read_text()
    reading = read_metrics(text, format=fmt)
    assert set(reading.groups) <= set(SAMPLE_NAMES[fmt])
    registry = fixture_registry(text, "same")
    answer = generate_latest(registry.restricted_registry(SAMPLE_NAMES[fmt]))
    sample_names = {s.name for f in text_string_to_metric_families(answer.decode())
                    for s in f.samples}
    assert sample_names <= set(SAMPLE_NAMES[fmt])
    assert len(answer) < len(text) // 5
    for detected in (fmt, None):
        assert same_state(expected(answer, detected), expected(text.encode(), detected))


def families(payload: bytes) -> list[bytes]:
    """The payload's families (HELP, TYPE, samples), sorted: a restricted registry writes them
    in no particular order."""
    return sorted(b"# HELP" + block for block in payload.split(b"# HELP") if block)


@pytest.mark.parametrize("kind", ["same", "busy"])
def test_the_benchmark_servers_answer_as_prometheus_client_renders(kind: str) -> None:
    query = urlsplit(filtered_path("vllm") or "").query
    names = SAMPLE_NAMES["vllm"]
    exposition = Exposition(VLLM_V1_TEXT, kind, cycle=3)
    registry = fixture_registry(VLLM_V1_TEXT, kind)
    for step in range(3):  # a fresh registry renders the same steps
        assert families(exposition.answer(query, step)) == families(generate_latest(
            registry.restricted_registry(names)))
    plain = Exposition(VLLM_V1_TEXT, kind, cycle=3).answer("", 0)
    assert plain == generate_latest(fixture_registry(VLLM_V1_TEXT, kind))
    assert exposition.answer(query, 3) == exposition.answer(query, 0)  # replayed in turn
    moved = {exposition.answer(query, step) for step in range(3)}
    assert len(moved) == (1 if kind == "same" else 3)


# The poller against prometheus_client servers.


async def test_a_configured_vllm_backend_is_scraped_filtered_from_the_first_request() -> None:
    with prometheus_http_server(fixture_registry(VLLM_V1_TEXT, "same")) as url:
        async with polling(url, "vllm") as (poller, fleet):
            await eventually(lambda: poller.scrapes_ok >= 3, "three scrapes")
            assert poller.scrapes_filtered == poller.scrapes_ok
            assert poller.scrapes_failed == 0
            got = snapshot(fleet)
    assert got is not None and same_state(got, expected(VLLM_V1, "vllm"))


async def test_the_filtered_path_works_through_an_aiohttp_session_too() -> None:
    """The https path: aiohttp's URL handling must keep the query prometheus_client reads."""
    recorder = Recorder(make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "same")))
    async with serving(recorder.handle) as url, aiohttp.ClientSession() as session, polling(
        url, "vllm", session=session
    ) as (poller, fleet):
        await eventually(lambda: poller.scrapes_ok >= 3, "three scrapes")
        got = snapshot(fleet)
    assert parse_qs(recorder.queries[0])["name[]"] == list(SAMPLE_NAMES["vllm"])
    assert poller.scrapes_filtered == poller.scrapes_ok and poller.scrapes_failed == 0
    assert got is not None and same_state(got, expected(VLLM_V1, "vllm"))


async def test_an_auto_detected_backend_reads_plain_metrics_once_then_filters() -> None:
    recorder = Recorder(make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "same")))
    async with serving(recorder.handle) as url, polling(url) as (poller, fleet):
        await eventually(lambda: poller.scrapes_ok >= 4, "four scrapes")
        got = snapshot(fleet)
    assert recorder.filtered()[:4] == [False, True, True, True]
    assert parse_qs(recorder.queries[1])["name[]"] == list(SAMPLE_NAMES["vllm"])
    assert poller.scrapes_failed == 0
    assert got is not None and got.format == "vllm" and same_state(got, expected(VLLM_V1))


async def test_a_server_that_ignores_the_query_is_read_from_its_whole_payload() -> None:
    recorder = Recorder(body(VLLM_V1))
    async with serving(recorder.handle) as url, polling(url, "vllm") as (poller, fleet):
        await eventually(lambda: poller.scrapes_ok >= 3, "three scrapes")
        got = snapshot(fleet)
    assert all(recorder.filtered()) and poller.scrapes_failed == 0
    assert got is not None and same_state(got, expected(VLLM_V1, "vllm"))


def rejecting_queries(status: int) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        if request.query_string:
            return web.Response(status=status, text="bad query")
        return web.Response(body=VLLM_V1, content_type="text/plain")

    return handler


def multiprocess_registry() -> CollectorRegistry:
    """As SGLang and multi-API-server vLLM set it up: a collector that declares no names
    (MultiProcessCollector has no `describe`), which `name[]` cannot select."""
    families = list(text_string_to_metric_families(VLLM_V1_TEXT))

    class Undescribed:
        def collect(self) -> list[Any]:
            return families

    registry = CollectorRegistry()
    registry.register(Undescribed())
    return registry


@pytest.mark.parametrize("answer", [
    pytest.param(lambda: rejecting_queries(400), id="400 to any query"),
    pytest.param(lambda: rejecting_queries(500), id="500 to any query"),
    pytest.param(lambda: make_aiohttp_handler(multiprocess_registry()),
                 id="a multiprocess registry answers name[] with nothing"),
    pytest.param(lambda: make_aiohttp_handler(fixture_registry(
        (FIXTURES / "sglang.prom").read_text(), "same")),
        id="a server of another format answers with none of our names"),
])
@pytest.mark.parametrize("fmt", [None, "vllm"], ids=["auto-detected", "configured"])
async def test_a_filtered_scrape_that_fails_falls_back_to_plain_metrics_in_the_same_scrape(
    answer: Callable[[], Handler], fmt: str | None
) -> None:
    """Plain /metrics answers the vLLM payload; a request with a query gets `answer`."""
    filtered_answer = answer()
    seen: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(bool(request.query_string))
        if not request.query_string:
            return web.Response(body=VLLM_V1, content_type="text/plain")
        response: web.StreamResponse = await filtered_answer(request)
        return response

    async with serving(handler) as url, polling(url, fmt) as (poller, fleet):
        await eventually(lambda: poller.scrapes_ok >= 5, "five scrapes")
        got = snapshot(fleet)
        healthy = fleet.is_healthy("b", time.monotonic())
    assert poller.scrapes_failed == 0 and healthy
    assert seen.count(True) == 1  # one filtered try, then plain /metrics only
    assert seen[seen.index(True) + 1] is False
    assert poller.scrapes_filtered == 0
    assert got is not None and same_state(got, expected(VLLM_V1, fmt))


async def test_a_filtered_scrape_that_times_out_is_a_failure_not_a_fallback() -> None:
    release = asyncio.Event()
    queries: list[str] = []

    async def hang(request: web.Request) -> web.Response:
        queries.append(request.query_string)
        await release.wait()
        return web.Response(body=VLLM_V1)

    async with serving(hang) as url:
        fleet = Fleet([BackendSpec(id="b", url=url, metrics_format="vllm")],
                      max_snapshot_age=5.0)
        poller = Poller(fleet, interval=0.02, timeout=0.1, backoff_max=0.1, backoff_after=2)
        async with poller.running():
            await eventually(lambda: poller.scrapes_failed >= 2, "two failed scrapes")
        release.set()
    assert queries and all(queries)  # never fell back to plain /metrics


async def test_a_backend_failing_on_both_paths_keeps_the_filter_for_when_it_answers() -> None:
    """A 503 to the filtered and to the plain request is the backend's failure, not the
    filter's: once it answers again, it is scraped filtered."""
    answers = {"left": 4}
    queries: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        queries.append(request.query_string)
        if answers["left"] > 0:
            answers["left"] -= 1
            return web.Response(status=503)
        return web.Response(body=VLLM_V1, content_type="text/plain")

    async with serving(handler) as url, polling(url, "vllm", threshold=5) as (poller, fleet):
        await eventually(lambda: poller.scrapes_filtered >= 3, "filtered scrapes")
        got = snapshot(fleet)
    assert poller.scrapes_failed == 2 and poller.scrapes_ok == poller.scrapes_filtered
    assert [bool(q) for q in queries[:4]] == [True, False, True, False]  # two failed scrapes
    assert got is not None and same_state(got, expected(VLLM_V1, "vllm"))


async def test_a_backend_that_fell_back_tries_filtering_again_after_its_scrapes_failed() -> None:
    mode = {"now": "reject"}
    queries: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        queries.append(request.query_string)
        if mode["now"] == "down":
            return web.Response(status=503)
        if mode["now"] == "reject" and request.query_string:
            return web.Response(status=400)
        return web.Response(body=VLLM_V1, content_type="text/plain")

    async with serving(handler) as url, polling(
        url, "vllm", threshold=1, backoff_max=0.05
    ) as (poller, fleet):
        await eventually(lambda: poller.scrapes_ok >= 3, "plain scrapes after the fallback")
        assert poller.scrapes_filtered == 0
        mode["now"] = "down"
        await eventually(lambda: fleet.scrape_failures("b") >= 1, "a failed scrape")
        mode["now"] = "filter"
        await eventually(lambda: poller.scrapes_filtered >= 2, "filtered scrapes again")
        got = snapshot(fleet)
        assert fleet.is_healthy("b", time.monotonic())
    assert got is not None and same_state(got, expected(VLLM_V1, "vllm"))


async def test_filtered_payloads_are_read_afresh_when_they_move() -> None:
    """The busy kind moves running, KV usage and a counter at every collection."""
    registry = fixture_registry(VLLM_V1_TEXT, "busy")
    async with serving(make_aiohttp_handler(registry)) as url, polling(url, "vllm") as (
        poller, fleet
    ):
        seen: set[int | None] = set()

        def moved() -> bool:
            current = snapshot(fleet)
            seen.add(current.running if current is not None else None)
            return len(seen - {None}) >= 3

        await eventually(moved, "three different running counts")
    assert poller.scrapes_failed == 0 and poller.scrapes_filtered == poller.scrapes_ok
