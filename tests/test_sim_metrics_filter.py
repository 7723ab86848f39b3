"""The simulator's /metrics honours `name[]` as prometheus_client does: the vLLM formats answer
with only the samples asked for, SGLang (a multiprocess registry) with nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import MappingProxyType

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from loadtest.bench_parse import fixture_registry
from loadtest.sim.engine import EngineStats
from loadtest.sim.exposition import FORMATS, ProcessSample, ServerInfo
from loadtest.sim.launch import running_sim
from routing.fleet import Fleet
from routing.metrics import parse_metrics, vllm
from routing.metrics.query import filtered_path
from routing.poller import Poller
from routing.state import BackendSpec

INFO = ServerInfo(model_name="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192)
PROCESS = ProcessSample(cpu_seconds=12.5, start_time=1_765_432_000.25)
STATS = EngineStats(
    running=24, waiting=3, num_gpu_blocks=27313, block_size=16, free_blocks=15795,
    used_blocks=27313 - 15795, kv_usage=1 - 15795 / 27312, preemptions_total=17,
    prefix_queries_tokens=1000, prefix_hits_tokens=600, prompt_tokens_total=2_938_406,
    generation_tokens_total=512_233, finished=MappingProxyType({"stop": 1402, "length": 118}))
FAST = 50.0


def render(fmt: str, names: list[str] | None) -> str:
    f = FORMATS[fmt]
    recorder = f.new_recorder()
    for seconds in (0.03, 0.3, 7.0):
        recorder.ttft.observe(seconds)
    return f.render(STATS, recorder, INFO, PROCESS, names)


def blocks(text: str) -> list[str]:
    """The payload's families (HELP, TYPE and sample lines), in a fixed order: prometheus_client
    writes the families of a restricted registry in no particular order."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP") or not out:
            out.append("")
        out[-1] += line + "\n"
    return sorted(out)


NAME_SETS = {
    "what kvgate asks for": list(vllm.SAMPLE_NAMES),
    "a histogram's buckets only": ["vllm:time_to_first_token_seconds_bucket"],
    "a histogram's sum and created": ["vllm:e2e_request_latency_seconds_sum",
                                      "vllm:e2e_request_latency_seconds_created"],
    "a counter's created sample alone keeps its empty header": [
        "vllm:num_preemptions_created"],
    "process series": ["process_cpu_seconds_total", "process_start_time_seconds"],
    "a family name matches no sample": ["vllm:num_preemptions", "vllm:e2e_request_latency_seconds"],
    "unknown names": ["nothing_here", "vllm:nope"],
}


@pytest.mark.parametrize("names", NAME_SETS.values(), ids=NAME_SETS.keys())
@pytest.mark.parametrize("fmt", ["vllm", "vllm-v0"])
def test_vllm_formats_filter_by_sample_name_as_prometheus_client_does(
    fmt: str, names: list[str]
) -> None:
    whole = render(fmt, None)
    registry = fixture_registry(whole, "same")  # prometheus_client over the same families
    theirs = generate_latest(registry.restricted_registry(names)).decode()
    ours = render(fmt, names)
    assert blocks(ours) == blocks(theirs)
    assert (ours == "") == (theirs == "")


def test_sglang_answers_any_name_filter_with_nothing_as_its_multiprocess_registry_does() -> None:
    class Undescribed:  # MultiProcessCollector declares no names
        def collect(self) -> list[Metric]:
            return []

    registry = CollectorRegistry()
    registry.register(Undescribed())
    assert generate_latest(registry.restricted_registry(["sglang:token_usage"])) == b""
    assert render("sglang", ["sglang:token_usage"]) == ""
    assert "sglang:token_usage" in render("sglang", None)


@pytest.mark.parametrize("query", ["", "?name[]=", "?other=1"],
                         ids=["no query", "a blank name[] is dropped", "other parameters"])
async def test_the_simulator_serves_everything_without_a_name_filter(query: str) -> None:
    async with running_sim(time_scale=FAST) as base, aiohttp.ClientSession() as session:
        async with session.get(f"{base}/metrics{query}") as resp:
            text = await resp.text()
    assert "vllm:time_to_first_token_seconds_bucket" in text
    assert "process_cpu_seconds_total" in text


async def test_the_simulator_answers_the_pollers_filtered_path_with_only_those_samples() -> None:
    path = filtered_path("vllm")
    assert path is not None
    async with running_sim(time_scale=FAST) as base, aiohttp.ClientSession() as session:
        async with session.get(base + path) as resp:
            filtered = await resp.read()
        async with session.get(f"{base}/metrics") as resp:
            whole = await resp.read()
    names = {line.split(b"{")[0].split(b" ")[0].decode()
             for line in filtered.splitlines() if line and not line.startswith(b"#")}
    assert names <= set(vllm.SAMPLE_NAMES) and "vllm:kv_cache_usage_perc" in names
    assert len(filtered) < len(whole) // 5
    got = parse_metrics(filtered, taken_at=0.0)
    assert got == parse_metrics(whole, taken_at=0.0)


async def poll_sim(fmt: str, done: Callable[[Poller], bool]) -> tuple[Poller, Fleet, str]:
    async with running_sim(time_scale=FAST, metrics_format=fmt) as base:
        fleet = Fleet([BackendSpec(id="b", url=base)], max_snapshot_age=5.0)
        poller = Poller(fleet, interval=0.02, timeout=2.0)
        async with poller.running():
            deadline = time.monotonic() + 15.0
            while not done(poller):
                assert time.monotonic() < deadline, "timed out waiting for scrapes"
                await asyncio.sleep(0.005)
        async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as resp:
            whole = await resp.text()
    return poller, fleet, whole


async def test_kvgate_scrapes_a_vllm_simulator_through_the_filter() -> None:
    poller, fleet, whole = await poll_sim("vllm", lambda p: p.scrapes_filtered >= 3)
    got = fleet.snapshot("b")
    assert poller.scrapes_failed == 0
    assert got is not None
    assert got._replace(taken_at=0.0) == parse_metrics(whole, taken_at=0.0)


async def test_kvgate_falls_back_to_plain_metrics_for_an_sglang_simulator() -> None:
    poller, fleet, whole = await poll_sim("sglang", lambda p: p.scrapes_ok >= 4)
    got = fleet.snapshot("b")
    assert poller.scrapes_failed == 0 and poller.scrapes_filtered == 0
    assert got is not None and got.format == "sglang"
    assert got._replace(taken_at=0.0) == parse_metrics(whole, taken_at=0.0)
