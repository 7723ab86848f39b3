"""Tiered filtered scrapes: between its scrapes of every name (one grid point in `full_every`), the
poller asks a vLLM backend for the moving series only, and completes them with the last full
answer's slow ones (cache config, LoRA adapters, success counter).

The servers are real prometheus_client expositions (its threaded HTTP server, and its aiohttp
handler) over the vLLM fixtures' families, one collector per family as vLLM registers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.bench_parse import fixture_registry
from loadtest.sim.launch import running_sim
from routing.fleet import Fleet
from routing.metrics import parse_metrics, read_metrics, snapshot_of, vllm
from routing.metrics.query import (
    HOT_NAMES,
    SAMPLE_NAMES,
    completed,
    hot_path,
    slow_groups,
)
from routing.poller import Poller, full_every_for
from routing.state import BackendSnapshot, BackendSpec
from tests.paths import FIXTURES, eventually
from tests.test_routing_poller_filter import (
    Recorder,
    expected,
    prometheus_http_server,
    same_state,
    serving,
)

VLLM_V1_TEXT = (FIXTURES / "vllm-v1.prom").read_text()
VLLM_V1 = VLLM_V1_TEXT.encode()
BLOCKS = 27313  # the V1 fixture's num_gpu_blocks
HOT = list(HOT_NAMES["vllm"])
FULL = list(SAMPLE_NAMES["vllm"])


def names_asked(query: str) -> list[str] | None:
    """The `name[]` values of a query, as prometheus_client reads them; None for plain."""
    return parse_qs(query).get("name[]")


class RecordingFleet(Fleet):
    """A Fleet that keeps every snapshot recorded, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded: list[BackendSnapshot] = []

    def record_scrape(self, backend_id: str, snapshot: BackendSnapshot) -> None:
        self.recorded.append(snapshot)
        super().record_scrape(backend_id, snapshot)


@contextlib.asynccontextmanager
async def polling(url: str, fmt: str | None = "vllm", **kwargs: Any
                  ) -> AsyncIterator[tuple[Poller, RecordingFleet]]:
    fleet = RecordingFleet([BackendSpec(id="b", url=url, metrics_format=fmt)],
                           max_snapshot_age=5.0)
    poller = Poller(fleet, interval=kwargs.pop("interval", 0.02),
                    timeout=kwargs.pop("timeout", 2.0), backoff_after=kwargs.pop("threshold", 5),
                    **kwargs)
    async with poller.running():
        yield poller, fleet


# The tiers: which names, and what a hot answer completed with slow groups reads as.


def test_the_hot_names_are_the_load_gauges_alone() -> None:
    # Running, waiting and KV usage (current and older name); cumulative counters (preemptions,
    # prefix cache queries and hits) come with every name, about once a second.
    assert set(HOT) == {vllm.RUNNING, vllm.WAITING, vllm.KV_USAGE, vllm.KV_USAGE_OLD}
    assert HOT == [name for name in FULL if name in HOT]  # in the same order
    assert HOT_NAMES["vllm-v0"] == HOT_NAMES["vllm"]
    assert names_asked(urlsplit(hot_path("vllm") or "").query) == HOT


@pytest.mark.parametrize("family", ["sglang", "tgi", "trtllm", "llamacpp"])
def test_formats_without_a_hot_tier_have_no_hot_path(family: str) -> None:
    assert hot_path(family) is None


def answer_to(registry: CollectorRegistry, names: list[str]) -> bytes:
    return generate_latest(registry.restricted_registry(names))


@pytest.mark.parametrize(("fixture", "fmt"), [
    ("vllm-v1.prom", "vllm"), ("vllm-v1.prom", None), ("vllm-v0.prom", "vllm-v0"),
    ("vllm-v0.prom", None),
], ids=["V1 configured", "V1 detected", "V0 configured", "V0 detected"])
def test_a_hot_answer_completed_with_the_slow_groups_reads_as_the_full_answer(
    fixture: str, fmt: str | None
) -> None:
    registry = fixture_registry((FIXTURES / fixture).read_text(), "same")
    full = read_metrics(answer_to(registry, FULL), format=fmt)
    hot = read_metrics(answer_to(registry, HOT), format=fmt)
    assert vllm.CACHE_CONFIG not in hot.groups and vllm.CACHE_CONFIG in full.groups
    merged = completed(hot, slow_groups(full.family, full.groups))
    assert merged == full
    assert snapshot_of(merged, taken_at=0.0) == snapshot_of(full, taken_at=0.0)


def test_a_group_the_hot_answer_carries_itself_is_the_fresher_one() -> None:
    """A server that ignores the query answers every name, the slow ones too."""
    stale = slow_groups("vllm", read_metrics(VLLM_V1, format="vllm").groups)
    fresh = read_metrics(VLLM_V1.replace(b'num_gpu_blocks="27313"', b'num_gpu_blocks="999"'),
                         format="vllm")
    merged = completed(fresh, stale)
    assert merged == fresh and stale[vllm.CACHE_CONFIG] != merged.groups[vllm.CACHE_CONFIG]
    assert snapshot_of(merged, taken_at=0.0).kv_total_blocks == 999


@pytest.mark.parametrize(("full_s", "interval_s", "every"), [
    (1.0, 0.1, 10), (1.0, 0.25, 4), (0.5, 0.5, 1), (0.05, 0.1, 1), (2.5, 0.1, 25),
])
def test_the_full_scrape_interval_is_a_whole_number_of_poll_intervals(
    full_s: float, interval_s: float, every: int
) -> None:
    assert full_every_for(full_s, interval_s) == every


def test_full_every_must_be_positive() -> None:
    fleet = Fleet([BackendSpec(id="b", url="http://127.0.0.1:9")])
    with pytest.raises(ValueError, match="full_every"):
        Poller(fleet, full_every=0)


# The poller against prometheus_client servers.


def runs_of_hot(queries: list[list[str] | None]) -> list[int]:
    """The lengths of the runs of hot queries, each after a full one."""
    runs: list[int] = []
    for names in queries:
        if names == FULL:
            runs.append(0)
        else:
            assert names == HOT, names
            runs[-1] += 1
    return runs


async def test_between_full_scrapes_the_poller_asks_for_the_moving_names_only() -> None:
    recorder = Recorder(make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "busy")))
    async with serving(recorder.handle) as url, polling(url, full_every=4) as (poller, fleet):
        await eventually(lambda: poller.scrapes_hot >= 6, "six hot scrapes")
        got = fleet.snapshot("b")
    queries = [names_asked(q) for q in recorder.queries]
    assert queries[0] == FULL  # the first filtered scrape asks for every name
    runs = runs_of_hot(queries)
    assert sum(runs) >= poller.scrapes_hot >= 6
    assert max(runs) <= 3  # a full answer at least every 4 grid points
    assert poller.scrapes_failed == 0 and poller.scrapes_filtered == poller.scrapes_ok
    assert got is not None and got.kv_total_blocks == BLOCKS and got.block_size == 16


async def test_full_every_1_asks_for_every_name_at_every_scrape() -> None:
    recorder = Recorder(make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "busy")))
    async with serving(recorder.handle) as url, polling(url, full_every=1) as (poller, _):
        await eventually(lambda: poller.scrapes_ok >= 4, "four scrapes")
    assert poller.scrapes_hot == 0
    assert all(names_asked(q) == FULL for q in recorder.queries)


async def test_an_auto_detected_backend_reads_plain_then_full_then_hot() -> None:
    recorder = Recorder(make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "same")))
    async with serving(recorder.handle) as url, polling(url, None, full_every=1000) as (
        poller, fleet
    ):
        await eventually(lambda: poller.scrapes_hot >= 2, "two hot scrapes")
        got = fleet.snapshot("b")
    assert [names_asked(q) for q in recorder.queries[:3]] == [None, FULL, HOT]
    assert got is not None and same_state(got, expected(VLLM_V1))


def without_family(text: str, name: str) -> tuple[str, str]:
    """`text` without the family `name` (its HELP, TYPE and sample lines), and those lines."""
    kept: list[str] = []
    cut: list[str] = []
    for line in text.splitlines(keepends=True):
        words = line.split()
        mentioned = len(words) > 2 and line.startswith("#") and words[2] == name
        (cut if mentioned or line.startswith((name + "{", name + " ")) else kept).append(line)
    return "".join(kept), "".join(cut)


class CacheConfig:
    """vLLM's cache config info gauge as one collector, its `num_gpu_blocks` settable while a
    server renders it (from another thread: the family is replaced whole), and counting the
    collections, that is the requests that asked for it."""

    def __init__(self, family: Metric) -> None:
        self.family = family
        self.collected = 0

    def describe(self) -> list[Metric]:
        return [self.family]

    def collect(self) -> list[Metric]:
        self.collected += 1
        return [self.family]

    def set_blocks(self, blocks: int) -> None:
        family = copy.copy(self.family)
        family.samples = [s._replace(labels={**s.labels, "num_gpu_blocks": str(blocks)})
                          for s in self.family.samples]
        self.family = family


@contextlib.contextmanager
def vllm_server(kind: str = "busy") -> Iterator[tuple[str, CacheConfig]]:
    """prometheus_client's HTTP server over the V1 fixture's families, the load moving at every
    request (running, KV usage, prefix-cache queries; "busy") or not ("same"), the cache config
    settable."""
    rest, lines = without_family(VLLM_V1_TEXT, vllm.CACHE_CONFIG)
    registry = fixture_registry(rest, kind)
    (family,) = text_string_to_metric_families(lines)
    config = CacheConfig(family)
    registry.register(config)
    with prometheus_http_server(registry) as url:
        yield url, config


async def test_between_full_scrapes_the_snapshot_has_the_last_cache_config_and_fresh_load(
) -> None:
    with vllm_server() as (url, config):
        async with polling(url, full_every=1000) as (poller, fleet):
            await eventually(lambda: poller.scrapes_hot >= 1, "a hot scrape")
            config.set_blocks(5000)  # seen at the next full scrape only, 1000 grid points away
            start = len(fleet.recorded)
            await eventually(lambda: poller.scrapes_hot >= 6, "more hot scrapes")
            recorded = fleet.recorded[start:]
        assert config.collected == 1  # one full scrape
    assert {s.kv_total_blocks for s in recorded} == {BLOCKS}
    assert {s.block_size for s in recorded} == {16}
    assert len({s.running for s in recorded}) == len(recorded)  # fresh at every scrape
    assert len({s.kv_free_blocks for s in recorded}) > 1
    assert poller.scrapes_failed == 0


@pytest.mark.parametrize("kind", ["busy", "same"],
                         ids=["moving load", "idle: the same hot answer before and after"])
async def test_a_change_of_num_gpu_blocks_shows_within_one_full_period(kind: str) -> None:
    full_every = 4
    with vllm_server(kind) as (url, config):
        async with polling(url, full_every=full_every) as (poller, fleet):
            await eventually(lambda: poller.scrapes_hot >= 1, "a hot scrape")
            config.set_blocks(5000)
            start = len(fleet.recorded)
            await eventually(lambda: any(s.kv_total_blocks == 5000 for s in fleet.recorded),
                             "the new capacity")
            hot_before = poller.scrapes_hot
            await eventually(lambda: poller.scrapes_hot >= hot_before + 2, "hot scrapes after it")
            recorded = fleet.recorded[start:]
    first_new = next(i for i, s in enumerate(recorded) if s.kv_total_blocks == 5000)
    # At most `full_every` scrapes after the change (one more: a scrape answered as it came).
    assert first_new < full_every + 1
    assert all(s.kv_total_blocks == 5000 for s in recorded[first_new:])
    assert poller.scrapes_failed == 0


async def test_a_server_that_ignores_the_query_shows_a_new_cache_config_at_once() -> None:
    answer = {"body": VLLM_V1}

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=answer["body"], content_type="text/plain")

    async with serving(handler) as url, polling(url, full_every=1000) as (poller, fleet):
        await eventually(lambda: poller.scrapes_hot >= 1, "a hot scrape")
        answer["body"] = VLLM_V1.replace(b'num_gpu_blocks="27313"', b'num_gpu_blocks="5000"')
        await eventually(lambda: (s := fleet.snapshot("b")) is not None
                         and s.kv_total_blocks == 5000, "the new capacity")
    assert poller.scrapes_failed == 0


def hot_answered(answer: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
    """prometheus_client's handler for plain and full queries; `answer` for the hot one."""
    full = make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "same"))

    async def handler(request: web.Request) -> web.StreamResponse:
        response: web.StreamResponse
        if names_asked(request.query_string) == HOT:
            response = await answer(request)
        else:
            response = await full(request)
        return response

    return handler


def status(code: int) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=code, text="no")

    return handler


def rendered(names: list[str], text: str = VLLM_V1_TEXT) -> Callable[[web.Request], Any]:
    """prometheus_client's answer for `names` of `text`'s families, whatever was asked."""
    registry = fixture_registry(text, "same")

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=answer_to(registry, names), content_type="text/plain")

    return handler


@pytest.mark.parametrize("answer", [
    pytest.param(lambda: status(500), id="500"),
    pytest.param(lambda: status(414), id="414"),
    pytest.param(lambda: rendered([]), id="an empty answer"),
    pytest.param(lambda: rendered([n for n in HOT if n != vllm.KV_USAGE]),
                 id="without KV usage, which the full answer had"),
    pytest.param(lambda: rendered(list(SAMPLE_NAMES["sglang"]),
                                  (FIXTURES / "sglang.prom").read_text()),
                 id="another format's series"),
])
async def test_a_wrong_hot_answer_falls_back_to_a_full_one_and_the_backend_stays_healthy(
    answer: Callable[[], Callable[[web.Request], Any]],
) -> None:
    recorder = Recorder(hot_answered(answer()))
    async with serving(recorder.handle) as url, polling(url, full_every=1000) as (
        poller, fleet
    ):
        await eventually(lambda: poller.scrapes_ok >= 6, "six scrapes")
        got = fleet.snapshot("b")
        healthy = fleet.is_healthy("b", time.monotonic())
    queries = [names_asked(q) for q in recorder.queries]
    # A full scrape, one hot try answered by a full one in the same scrape, then full ones
    # (not one in 1000: the hot query was at fault).
    assert queries[:3] == [FULL, HOT, FULL]
    assert queries.count(HOT) == 1 and None not in queries
    assert poller.scrapes_failed == 0 and healthy
    assert poller.scrapes_hot == 0 and poller.scrapes_filtered == poller.scrapes_ok
    assert got is not None and same_state(got, expected(VLLM_V1, "vllm"))


async def test_after_a_failed_scrape_the_next_asks_for_every_name_then_hot_again() -> None:
    """A hot request that times out is a failure (no fallback): the backend may come back as
    another server, so its next scrape asks for every name, though no full one is due."""
    full = make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "same"))
    armed, release = {"hang": False, "at": -1}, asyncio.Event()
    queries: list[list[str] | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        names = names_asked(request.query_string)
        queries.append(names)
        if armed["hang"] and names == HOT:
            armed["hang"], armed["at"] = False, len(queries)
            await release.wait()
        response: web.StreamResponse = await full(request)
        return response

    async with serving(handler) as url:
        async with polling(url, full_every=1000, timeout=0.2) as (poller, fleet):
            await eventually(lambda: poller.scrapes_hot >= 1, "a hot scrape")
            armed["hang"] = True
            await eventually(lambda: poller.scrapes_failed >= 1, "a timed-out scrape")
            await eventually(lambda: poller.scrapes_hot >= 3, "hot scrapes again")
            healthy = fleet.is_healthy("b", time.monotonic())
        release.set()
    hung = int(armed["at"])  # the index of the request after the hung one
    assert queries[hung - 1] == HOT and queries[hung:hung + 2] == [FULL, HOT]
    assert queries.count(FULL) == 2  # the first scrape's, and the one after the failure
    assert poller.scrapes_failed == 1 and healthy


@pytest.mark.parametrize("fmt", ["vllm", "vllm-v0"])
async def test_kvgate_scrapes_a_vllm_simulator_hot_between_full_scrapes(fmt: str) -> None:
    async with running_sim(time_scale=50.0, metrics_format=fmt) as base:
        async with polling(base, None, full_every=3) as (poller, fleet):
            await eventually(lambda: poller.scrapes_hot >= 4, "four hot scrapes")
            got = fleet.snapshot("b")
        async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as resp:
            whole = await resp.read()
    assert poller.scrapes_failed == 0 and poller.scrapes_filtered == poller.scrapes_ok - 1
    assert got is not None and same_state(got, parse_metrics(whole, taken_at=0.0))


# Hot answers read from their numbers (routing/metrics/template.py).


class Waiting:
    """vLLM's waiting gauge as one collector, moving at every collection, its model label
    settable while the server runs."""

    def __init__(self) -> None:
        self.model = "meta-llama/Llama-3.1-8B-Instruct"
        self.collected = 0

    def family(self) -> Metric:
        family = GaugeMetricFamily(vllm.WAITING, "Number of requests waiting to be processed.",
                                   labels=["engine", "model_name"])
        family.add_metric(["0", self.model], float(self.collected % 5))
        return family

    def describe(self) -> list[Metric]:
        return [self.family()]

    def collect(self) -> list[Metric]:
        self.collected += 1
        return [self.family()]


class Answers:
    """prometheus_client's answers over `registry`, each one kept with the names it was for."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.served: list[tuple[list[str] | None, bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        names = names_asked(request.query_string)
        registry = self.registry if names is None else self.registry.restricted_registry(names)
        body = generate_latest(registry)
        self.served.append((names, body))
        return web.Response(body=body, content_type="text/plain")

    def snapshots(self) -> list[BackendSnapshot]:
        """What a whole parse makes of each answer: a hot one completed with the slow groups of
        the last full one."""
        out: list[BackendSnapshot] = []
        slow: dict[str, bytes] = {}
        for names, body in self.served:
            reading = read_metrics(body, format="vllm")
            if names == HOT:
                reading = completed(reading, slow)
            else:
                slow = slow_groups("vllm", reading.groups)
            out.append(snapshot_of(reading, taken_at=0.0))
        return out


async def test_hot_answers_read_from_their_numbers_give_what_a_whole_parse_gives() -> None:
    # A busy server: running, KV usage, waiting and a prefix-cache counter move at every
    # request. Then the hot answers' labels change (a new model name: read whole again), and the
    # cache config changes (seen from the next full answer on).
    rest, config_lines = without_family(VLLM_V1_TEXT, vllm.CACHE_CONFIG)
    rest, _ = without_family(rest, vllm.WAITING)
    registry = fixture_registry(rest, "busy")
    (config_family,) = text_string_to_metric_families(config_lines)
    config, waiting = CacheConfig(config_family), Waiting()
    registry.register(config)
    registry.register(waiting)
    answers = Answers(registry)
    async with serving(answers.handle) as url, polling(url, full_every=4) as (poller, fleet):
        await eventually(lambda: poller.scrapes_templated >= 6, "hot answers read from numbers")
        waiting.model = "other/model"
        await eventually(lambda: any("other/model" in (s.models or ()) for s in fleet.recorded),
                         "the new model name")
        templated = poller.scrapes_templated
        await eventually(lambda: poller.scrapes_templated >= templated + 6, "numbers again")
        config.set_blocks(5000)
        await eventually(lambda: poller.scrapes_templated >= templated + 12
                         and fleet.recorded[-1].kv_total_blocks == 5000, "the new capacity")
        recorded = list(fleet.recorded)
    assert poller.scrapes_failed == 0
    want = answers.snapshots()
    assert len(want) >= len(recorded) >= 20
    for i, (got, expect) in enumerate(zip(recorded, want, strict=False)):
        assert same_state(got, expect), i
    # Most hot answers were read from their numbers; the preemption and prefix-cache figures
    # moved with the full answers in between.
    assert poller.scrapes_templated >= poller.scrapes_hot // 2
    assert len({s.prefix_cache_hit_rate for s in recorded}) > 3


@pytest.mark.parametrize(("full_s", "hot_between"), [(0.02, False), (0.1, True)],
                         ids=["at the poll interval: every name", "5 intervals: hot between"])
async def test_the_gateway_asks_for_every_name_as_often_as_configured(
    full_s: float, hot_between: bool
) -> None:
    recorder = Recorder(make_aiohttp_handler(fixture_registry(VLLM_V1_TEXT, "busy")))
    async with serving(recorder.handle) as url:
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": url, "metrics_format": "vllm"}],
            "routing": {"poll_interval_s": 0.02},
            "advanced": {"full_scrape_interval_s": full_s},
        })
        async with running_gateway(settings):
            await eventually(lambda: len(recorder.queries) >= 12, "a dozen scrapes")
    queries = [names_asked(q) for q in recorder.queries[:12]]
    assert queries[0] == FULL
    if hot_between:
        assert max(runs_of_hot(queries)) <= 4 and HOT in queries
    else:
        assert all(names == FULL for names in queries)
