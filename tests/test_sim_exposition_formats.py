"""The simulator as a TGI or a llama.cpp server: its /metrics (and llama.cpp's /slots) in the real
servers' shapes, read by the gateway's own parsers and poller into the engine's true state."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from types import MappingProxyType
from typing import Any

import aiohttp
import orjson
import pytest

from loadtest.sim.engine import Engine, EngineStats, RunningSeq, SimRequest, StepResult
from loadtest.sim.exposition import (
    FORMATS,
    TGI_DURATION,
    ProcessSample,
    ServerInfo,
    format_cpp,
    format_rust,
)
from loadtest.sim.launch import serving
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from loadtest.sim.server import SIM_STATE, SimSettings, create_app
from loadtest.sim.slots import (
    RequestParams,
    SlotTable,
    render_slots,
)
from routing.fleet import Fleet
from routing.metrics import detect_family, parse_metrics, parse_slots, with_slots
from routing.poller import Poller
from routing.state import BackendSnapshot, BackendSpec
from tests.paths import FIXTURES, eventually

INFO = ServerInfo(model_name="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192)
PROCESS = ProcessSample(cpu_seconds=12.5, start_time=1_765_432_000.25)
FIXTURE_OF = {"tgi": "tgi.prom", "llamacpp": "llamacpp.prom"}
NEW_FORMATS = list(FIXTURE_OF)
PRESET = PRESETS[DEFAULT_PRESET]


def stats(*, total: int = 8193, free: int = 4353, running: int = 32, waiting: int = 6,
          caching: bool = True) -> EngineStats:
    return EngineStats(
        running=running, waiting=waiting, num_gpu_blocks=total, block_size=16, free_blocks=free,
        used_blocks=total - free, kv_usage=1 - free / (total - 1), preemptions_total=4,
        prefix_queries_tokens=168_597 if caching else 0,
        prefix_hits_tokens=120_384 if caching else 0, prompt_tokens_total=170_000,
        generation_tokens_total=1_234_567,
        finished=MappingProxyType({"stop": 1402, "length": 88, "abort": 9}))


def render(fmt: str, engine_stats: EngineStats | None = None, *, caching: bool = True,
           e2e: tuple[float, ...] = ()) -> str:
    f = FORMATS[fmt]
    recorder = f.new_recorder()
    for seconds in e2e:
        recorder.e2e.observe(seconds)
    info = ServerInfo(INFO.model_name, INFO.max_model_len, enable_prefix_caching=caching)
    return f.render(engine_stats or stats(caching=caching), recorder, info, PROCESS)


def fixture(fmt: str) -> str:
    return (FIXTURES / FIXTURE_OF[fmt]).read_text()


# (a) The gateway's parser reads the engine's figures back.

@pytest.mark.parametrize("configured", [True, False], ids=["format configured", "detected"])
@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_the_gateways_parser_reads_running_and_waiting(fmt: str, configured: bool) -> None:
    s = stats(running=17, waiting=5)
    snap = parse_metrics(render(fmt, s), taken_at=1.0, format=fmt if configured else None)
    assert (snap.format, snap.running, snap.waiting) == (fmt, 17, 5)


def test_tgi_batch_claim_against_the_whole_cache_gives_the_engines_free_tokens() -> None:
    s = stats(total=8193, free=4353)
    budget = (8193 - 1) * 16  # the whole cache: TGI's max_batch_total_tokens after warm-up
    snap = parse_metrics(render("tgi", s), taken_at=1.0, max_batch_total_tokens=budget)
    assert (snap.kv_total_blocks, snap.kv_free_blocks, snap.block_size) == (budget, 4353 * 16, 1)
    assert snap.kv_usage == pytest.approx(s.kv_usage)


def test_tgi_without_a_configured_budget_reports_no_kv_figures() -> None:
    snap = parse_metrics(render("tgi"), taken_at=1.0)
    assert (snap.kv_total_blocks, snap.kv_free_blocks, snap.kv_usage) == (None, None, None)


@pytest.mark.parametrize(("caching", "hit_rate"), [(True, 120_384 / 168_597), (False, 0.0)],
                         ids=["prefix caching: the engine's hit rate", "no caching: no hits"])
def test_llamacpp_prompt_counters_give_the_engines_prefix_hit_rate(caching: bool,
                                                                    hit_rate: float) -> None:
    snap = parse_metrics(render("llamacpp", caching=caching), taken_at=1.0)
    assert snap.prefix_cache_hit_rate == pytest.approx(hit_rate, rel=1e-5)  # %g: 6 digits
    assert (snap.kv_total_blocks, snap.kv_usage) == (None, None)  # KV comes from /slots


def test_tgi_counts_only_requests_that_ended_by_themselves_as_successes() -> None:
    lines = render("tgi").splitlines()
    assert "tgi_request_success 1490" in lines  # stop 1402 + length 88; the 9 aborts are not


# (b) Detected as its family.

@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_the_payload_is_detected_as_its_servers_family(fmt: str) -> None:
    assert detect_family(render(fmt)) == fmt


# (c) The real servers' names, types, HELP lines, labels, bounds and number formatting.

def headers(text: str) -> set[str]:
    return {line for line in text.splitlines() if line.startswith("#")}


def sample_shapes(text: str) -> set[tuple[str, frozenset[str]]]:
    """(sample name, label names) of every sample line."""
    out = set()
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        series = line.rsplit(" ", 1)[0]
        name, _, labels = series.partition("{")
        out.add((name, frozenset(p.split("=", 1)[0] for p in labels.rstrip("}").split(",")
                                 if p)))
    return out


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_help_and_type_lines_are_the_real_servers(fmt: str) -> None:
    ours = headers(render(fmt))
    assert ours and ours <= headers(fixture(fmt)), ours - headers(fixture(fmt))


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_sample_names_and_label_sets_are_the_real_servers(fmt: str) -> None:
    ours = sample_shapes(render(fmt))
    assert ours <= sample_shapes(fixture(fmt)), ours - sample_shapes(fixture(fmt))


@pytest.mark.parametrize(("fmt", "names"), [
    ("tgi", ["tgi_request_success", "tgi_batch_current_max_tokens", "tgi_batch_current_size",
             "tgi_queue_size", "tgi_request_duration"]),
    ("llamacpp", ["llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                  "llamacpp:tokens_predicted_total", "llamacpp:spec_decode_num_draft_tokens_total",
                  "llamacpp:spec_decode_num_accepted_tokens_total",
                  "llamacpp:spec_decode_num_drafts_total", "llamacpp:requests_processing",
                  "llamacpp:requests_deferred"]),
], ids=["tgi", "llamacpp"])
def test_families_come_in_the_real_servers_order(fmt: str, names: list[str]) -> None:
    def order(text: str) -> list[str]:
        return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]

    assert order(render(fmt)) == names
    theirs = order(fixture(fmt))
    assert [n for n in theirs if n in names] == names


def test_tgi_duration_buckets_are_written_as_tgi_writes_them() -> None:
    def bounds(text: str) -> list[str]:
        return [line.split('le="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("tgi_request_duration_bucket")]

    assert len(TGI_DURATION) == 35
    assert bounds(render("tgi")) == bounds(fixture("tgi"))


def test_tgi_duration_histogram_is_the_recorders_e2e_cumulatively() -> None:
    lines = render("tgi", e2e=(0.0002, 3.0, 500.0)).splitlines()
    assert 'tgi_request_duration_bucket{le="0.00015000000000000001"} 0' in lines
    assert 'tgi_request_duration_bucket{le="0.00022500000000000002"} 1' in lines
    assert 'tgi_request_duration_bucket{le="3.787675244106352"} 2' in lines
    assert 'tgi_request_duration_bucket{le="145.61096060497135"} 2' in lines
    assert 'tgi_request_duration_bucket{le="+Inf"} 3' in lines
    assert lines[-2:] == ["tgi_request_duration_sum 503.0002", "tgi_request_duration_count 3"]


@pytest.mark.parametrize(("value", "text"), [
    (3728.0, "3728"), (61440.0, "61440"), (11494.906950209923, "11494.906950209923"),
    (0.0001 * 1.5, "0.00015000000000000001"), (81.92, "81.92"), (0.0, "0"),
    (1.5e-05, "0.000015"), (2e16, "20000000000000000"), (math.nan, "NaN"), (math.inf, "inf"),
], ids=lambda v: str(v))
def test_tgi_numbers_are_written_as_rust_displays_an_f64(value: float, text: str) -> None:
    assert format_rust(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (48213.0, "48213"), (21.387, "21.387"), (1_234_567.0, "1.23457e+06"), (25031.2, "25031.2"),
    (48.15372, "48.1537"), (0.0, "0"), (16384.0, "16384"),
], ids=lambda v: str(v))
def test_llamacpp_numbers_are_written_as_a_cpp_stream_writes_a_double(value: float,
                                                                      text: str) -> None:
    assert format_cpp(value) == text


@pytest.mark.parametrize("fmt", NEW_FORMATS)
def test_servers_that_do_not_filter_ignore_the_name_query(fmt: str) -> None:
    f = FORMATS[fmt]
    asked = f.render(stats(), f.new_recorder(), INFO, PROCESS, ["tgi_queue_size"])
    assert asked == render(fmt)


# llama.cpp's /slots.

def view(request_id: str, prompt: int, decoded: int, cached: int = 0) -> RunningSeq:
    return RunningSeq(request_id, prompt, cached, prompt + decoded - 1, decoded)


def test_slots_json_has_llamacpps_shape_and_the_gateway_reads_its_kv() -> None:
    running = [view("a", 1874, 312, cached=1536), view("b", 897, 14)]
    params = {"a": RequestParams(n_predict=1024, stream=True)}
    body = render_slots(running, {"a": 0, "b": 2}, 4, 4096, params)
    slots = orjson.loads(body)
    real = orjson.loads((FIXTURES / "llamacpp-slots.json").read_bytes())
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert [s["is_processing"] for s in slots] == [True, False, True, False]
    for ours in slots:  # every key is one llama.cpp writes, in its order
        theirs = real[0] if ours["is_processing"] else real[3]
        assert [k for k in theirs if k in ours] == list(ours)
    assert set(slots[0]["params"]) <= set(real[0]["params"])
    assert set(slots[0]["next_token"][0]) <= set(real[0]["next_token"][0])
    assert (slots[0]["n_past"], slots[0]["n_prompt_tokens_cache"]) == (2185, 1536)
    assert slots[0]["next_token"] == [{"has_next_token": True, "n_remain": 712,
                                       "n_decoded": 312}]
    assert slots[0]["params"] == {"max_tokens": 1024, "n_predict": 1024, "stream": True}
    read = parse_slots(body)
    assert (read.total_tokens, read.used_tokens, read.processing) == (4 * 4096, 2185 + 910, 2)
    snap = with_slots(BackendSnapshot(taken_at=0.0, format="llamacpp", running=2), read)
    assert (snap.kv_total_blocks, snap.kv_free_blocks) == (16384, 16384 - 3095)


def test_a_running_request_keeps_its_slot_and_a_new_one_takes_the_lowest_free() -> None:
    table = SlotTable(3)
    assert table.assign(["a", "b", "c"]) == {"a": 0, "b": 1, "c": 2}
    assert table.assign(["b", "c"]) == {"b": 1, "c": 2}  # a ended: c stays in slot 2
    assert table.assign(["b", "c", "d"]) == {"b": 1, "c": 2, "d": 0}
    with pytest.raises(ValueError, match="4 running sequences for 3 slots"):
        table.assign(["b", "c", "d", "e"])


def test_the_engine_view_gives_each_sequences_context_and_decoded_tokens() -> None:
    """Through chunked prefill and bulk decoding: n_past is prompt + decoded - 1 once decoding,
    and the sequences' blocks are the engine's used blocks (no prefix shared here)."""
    preset = PRESETS["llama-3.2-1b-l40s"]  # a context longer than a step's token budget
    engine = Engine(preset)
    long_prompt = preset.max_num_batched_tokens + 100  # two prefill steps
    engine.add(SimRequest("long", tuple(range(1, long_prompt + 1)), max_tokens=500,
                          natural_len=500, ignore_eos=True))
    engine.add(SimRequest("short", tuple(range(50_000, 50_040)), max_tokens=500,
                          natural_len=500, ignore_eos=True))
    emitted = {"long": 0, "short": 0}
    for _ in range(40):
        for event in engine.step().events:
            emitted[event.request_id] = event.token_index + 1
        views = {v.request_id: v for v in engine.running_sequences()}
        assert {r: v.decoded for r, v in views.items()} == {r: n for r, n in emitted.items()
                                                            if r in views}
        for v in views.values():
            if v.decoded:
                assert v.context_tokens == v.prompt_tokens + v.decoded - 1
            else:
                assert 0 < v.context_tokens < v.prompt_tokens  # mid-prefill
        held = sum(-(-v.context_tokens // engine.block_size) for v in views.values())
        assert held == engine.stats().used_blocks - 1
    assert emitted["long"] > 30 and emitted["short"] > 30


# (d) End to end: the simulator on loopback, scraped by the gateway's poller.

FROZEN = StepResult(1e6, (), 0, 0, ())  # a step the driver waits on for ~forever


@contextlib.asynccontextmanager
async def simulator(fmt: str, monkeypatch: pytest.MonkeyPatch
                    ) -> AsyncIterator[tuple[str, Engine, Callable[[], None]]]:
    """A simulator with `fmt`; yields its URL, its engine and `freeze()`, after which the
    engine takes no more steps (requests submitted then stay waiting)."""
    app = create_app(SimSettings(metrics_format=fmt, time_scale=1000.0))
    engine = app[SIM_STATE].engine
    frozen = False
    real_step = engine.step

    def step() -> StepResult:
        return FROZEN if frozen else real_step()

    def freeze() -> None:
        nonlocal frozen
        frozen = True

    monkeypatch.setattr(engine, "step", step)
    async with serving(app) as url:
        yield url, engine, freeze


async def generate_forever(http: aiohttp.ClientSession, url: str, prompt: list[int]) -> None:
    body = {"prompt": prompt, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()  # until cancelled: the reply is far longer than any test waits


@contextlib.asynccontextmanager
async def loaded(url: str, engine: Engine, freeze: Callable[[], None]
                 ) -> AsyncIterator[list[list[int]]]:
    """Two requests running, then the engine frozen, then a third one waiting; yields the
    prompts (distinct from their first token: no prefix block is shared)."""
    prompts = [list(range(1000, 1040)), list(range(2000, 2050)), list(range(3000, 3060))]
    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(generate_forever(http, url, p)) for p in prompts[:2]]
        try:
            await eventually(lambda: engine.stats().running == 2, "two requests running")
            freeze()
            tasks.append(asyncio.create_task(generate_forever(http, url, prompts[2])))
            await eventually(lambda: engine.stats().waiting == 1, "a third request waiting")
            yield prompts
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def polled(spec: BackendSpec, want: Callable[[BackendSnapshot], bool]) -> BackendSnapshot:
    fleet = Fleet([spec], max_snapshot_age=5.0)
    async with Poller(fleet, interval=0.01, timeout=0.5).running():
        def ready() -> bool:
            snap = fleet.snapshot(spec.id)
            return snap is not None and want(snap)

        await eventually(ready, f"a {spec.metrics_format or 'detected'} snapshot as expected")
    snap = fleet.snapshot(spec.id)
    assert snap is not None and fleet.is_healthy(spec.id, time.monotonic())
    return snap


@pytest.mark.parametrize("configured", [True, False], ids=["format configured", "detected"])
async def test_the_poller_reads_a_simulated_tgi_with_its_batch_budget(
        configured: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    async with simulator("tgi", monkeypatch) as (url, engine, freeze), loaded(url, engine, freeze):
        s = engine.stats()
        budget = (s.num_gpu_blocks - 1) * s.block_size
        spec = BackendSpec(id="tgi", url=url, metrics_format="tgi" if configured else None,
                           max_batch_total_tokens=budget)
        snap = await polled(spec, lambda snap: snap.waiting == 1)
    assert (snap.format, snap.running, snap.waiting) == ("tgi", 2, 1)
    assert (snap.kv_total_blocks, snap.kv_free_blocks, snap.block_size) == (
        budget, s.free_blocks * s.block_size, 1)
    assert 0 < snap.kv_free_blocks < budget


@pytest.mark.parametrize("configured", [True, False], ids=["format configured", "detected"])
async def test_the_poller_reads_a_simulated_llamacpp_with_kv_from_its_slots(
        configured: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    async with simulator("llamacpp", monkeypatch) as (url, engine, freeze), \
            loaded(url, engine, freeze) as prompts:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/slots") as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            slots: list[dict[str, Any]] = await resp.json()
        spec = BackendSpec(id="llama", url=url, metrics_format="llamacpp" if configured else None)
        snap = await polled(
            spec, lambda snap: snap.waiting == 1 and snap.kv_total_blocks is not None)
        s = engine.stats()
    n_ctx = (s.num_gpu_blocks - 1) * s.block_size // PRESET.max_num_seqs
    assert len(slots) == PRESET.max_num_seqs and {slot["n_ctx"] for slot in slots} == {n_ctx}
    busy = [slot for slot in slots if slot["is_processing"]]
    assert [slot["id"] for slot in busy] == [0, 1]  # in admission order, lowest ids first
    assert [slot["n_prompt_tokens"] for slot in busy] == [len(p) for p in prompts[:2]]
    for slot in busy:
        decoded = slot["next_token"][0]["n_decoded"]
        assert slot["n_past"] == slot["n_prompt_tokens"] + decoded - 1 < n_ctx
        assert slot["params"]["n_predict"] == 1000
        assert slot["next_token"][0]["n_remain"] == 1000 - decoded
    # Every block the engine holds is a running sequence's context.
    assert sum(-(-slot["n_past"] // s.block_size) for slot in busy) == s.used_blocks - 1
    used = sum(slot["n_past"] for slot in busy)
    assert (snap.format, snap.running, snap.waiting) == ("llamacpp", 2, 1)
    assert (snap.kv_total_blocks, snap.kv_free_blocks, snap.block_size) == (
        PRESET.max_num_seqs * n_ctx, PRESET.max_num_seqs * n_ctx - used, 1)


async def test_a_llamacpp_configured_with_unified_kv_takes_one_slots_context_as_capacity(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with simulator("llamacpp", monkeypatch) as (url, engine, freeze), \
            loaded(url, engine, freeze):
        spec = BackendSpec(id="llama", url=url, metrics_format="llamacpp", kv_unified=True)
        snap = await polled(
            spec, lambda snap: snap.waiting == 1 and snap.kv_total_blocks is not None)
        s = engine.stats()
    assert snap.kv_total_blocks == (s.num_gpu_blocks - 1) * s.block_size // PRESET.max_num_seqs


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "tgi"])
async def test_slots_is_not_found_on_other_servers(fmt: str) -> None:
    app = create_app(SimSettings(metrics_format=fmt, time_scale=1000.0))
    async with serving(app) as url, aiohttp.ClientSession() as http:
        async with http.get(f"{url}/slots") as resp:
            assert resp.status == 404


async def test_a_fresh_tgi_is_healthy_and_idle_for_the_poller_when_configured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Like TGI, a simulated TGI that has not been sent a request writes none of its load gauges;
    # a backend configured as TGI is then idle, not failing (which would keep every request
    # away from it, and so the gauges away too).
    async with simulator("tgi", monkeypatch) as (url, engine, _):
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
            assert b"tgi_queue_size" not in await resp.read()
        s = engine.stats()
        budget = (s.num_gpu_blocks - 1) * s.block_size
        spec = BackendSpec(id="tgi", url=url, metrics_format="tgi", max_batch_total_tokens=budget)
        snap = await polled(spec, lambda snap: True)
    assert (snap.format, snap.running, snap.waiting) == ("tgi", 0, 0)
    assert (snap.kv_total_blocks, snap.kv_free_blocks) == (budget, budget)


def test_tgi_writes_its_load_gauges_once_it_has_been_sent_a_request() -> None:
    fresh = stats(running=0, waiting=0, free=8192, caching=False)._replace(
        prompt_tokens_total=0, generation_tokens_total=0, finished=MappingProxyType({}))
    assert "tgi_queue_size" not in render("tgi", fresh)
    for seen in (fresh._replace(waiting=1), fresh._replace(running=1),
                 fresh._replace(finished=MappingProxyType({"abort": 1}))):
        text = render("tgi", seen)
        assert "tgi_queue_size" in text and "tgi_batch_current_size" in text
