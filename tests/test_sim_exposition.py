"""The simulator's /metrics text: real servers' names, types, HELP lines, labels and buckets, and
values a fixture-tested parser reads back exactly."""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from loadtest.sim.engine import EngineStats
from loadtest.sim.exposition import (
    FORMATS,
    Histogram,
    LatencyRecorder,
    ProcessSample,
    ServerInfo,
    format_value,
)
from tests.paths import FIXTURES

FIXTURE_OF = {"vllm": "vllm-v1.prom", "vllm-v0": "vllm-v0.prom", "sglang": "sglang.prom",
              "tgi": "tgi.prom", "llamacpp": "llamacpp.prom"}
INFO = ServerInfo(model_name="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192)
PROCESS = ProcessSample(cpu_seconds=12.5, start_time=1_765_432_000.25)


def stats(*, total: int = 27313, free: int = 15795, running: int = 24, waiting: int = 3,
          block_size: int = 16) -> EngineStats:
    return EngineStats(
        running=running, waiting=waiting, num_gpu_blocks=total, block_size=block_size,
        free_blocks=free, used_blocks=total - free, kv_usage=1 - free / (total - 1),
        preemptions_total=17, prefix_queries_tokens=1000, prefix_hits_tokens=600,
        prompt_tokens_total=2_938_406, generation_tokens_total=512_233,
        finished=MappingProxyType({"stop": 1402, "length": 118, "abort": 9}))


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def render(fmt: str, engine_stats: EngineStats | None = None,
           recorder: LatencyRecorder | None = None) -> str:
    f = FORMATS[fmt]
    return f.render(engine_stats or stats(), recorder or f.new_recorder(), INFO, PROCESS)


def value(fams: dict[str, Any], name: str, **labels: str) -> float:
    for sample in fams[name].samples:
        if sample.name in (name, name + "_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


# (format, family name as the parser reports it, type): what each format must expose.
REQUIRED = [
    ("vllm", "vllm:num_requests_running", "gauge"),
    ("vllm", "vllm:num_requests_waiting", "gauge"),
    ("vllm", "vllm:kv_cache_usage_perc", "gauge"),
    ("vllm", "vllm:cache_config_info", "gauge"),
    ("vllm", "vllm:num_preemptions", "counter"),
    ("vllm", "vllm:prefix_cache_queries", "counter"),
    ("vllm", "vllm:prefix_cache_hits", "counter"),
    ("vllm", "vllm:request_success", "counter"),
    ("vllm", "vllm:prompt_tokens", "counter"),
    ("vllm", "vllm:generation_tokens", "counter"),
    ("vllm", "vllm:time_to_first_token_seconds", "histogram"),
    ("vllm", "vllm:inter_token_latency_seconds", "histogram"),
    ("vllm", "vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm-v0", "vllm:gpu_cache_usage_perc", "gauge"),
    ("vllm-v0", "vllm:num_requests_running", "gauge"),
    ("vllm-v0", "vllm:num_requests_waiting", "gauge"),
    ("vllm-v0", "vllm:num_requests_swapped", "gauge"),
    ("vllm-v0", "vllm:cache_config_info", "gauge"),
    ("vllm-v0", "vllm:num_preemptions", "counter"),
    ("vllm-v0", "vllm:gpu_prefix_cache_hit_rate", "gauge"),
    ("vllm-v0", "vllm:time_to_first_token_seconds", "histogram"),
    ("vllm-v0", "vllm:time_per_output_token_seconds", "histogram"),
    ("vllm-v0", "vllm:e2e_request_latency_seconds", "histogram"),
    ("sglang", "sglang:token_usage", "gauge"),
    ("sglang", "sglang:num_running_reqs", "gauge"),
    ("sglang", "sglang:num_queue_reqs", "gauge"),
    ("sglang", "sglang:max_total_num_tokens", "gauge"),
    ("sglang", "sglang:page_size", "gauge"),
    ("sglang", "sglang:num_retracted_requests", "counter"),
    ("sglang", "sglang:time_to_first_token_seconds", "histogram"),
    ("sglang", "sglang:e2e_request_latency_seconds", "histogram"),
]


@pytest.mark.parametrize(("fmt", "name", "kind"), REQUIRED,
                         ids=[f"{f} exposes {n}" for f, n, _ in REQUIRED])
def test_format_exposes_the_servers_family(fmt: str, name: str, kind: str) -> None:
    assert families(render(fmt))[name].type == kind


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_family_matches_the_real_servers_help_type_and_label_names(fmt: str) -> None:
    ours = families(render(fmt))
    theirs = families((FIXTURES / FIXTURE_OF[fmt]).read_text())
    for name, fam in ours.items():
        assert name in theirs, f"{name} is not a {fmt} family"
        real = theirs[name]
        assert (fam.type, fam.documentation) == (real.type, real.documentation), name
        our_labels = {frozenset(s.labels) for s in fam.samples}
        real_labels = {frozenset(s.labels) for s in real.samples}
        assert our_labels <= real_labels, f"{name}: labels {our_labels} vs {real_labels}"


@pytest.mark.parametrize(("fmt", "histogram"), [
    ("vllm", "vllm:time_to_first_token_seconds"),
    ("vllm", "vllm:inter_token_latency_seconds"),
    ("vllm", "vllm:e2e_request_latency_seconds"),
    ("vllm-v0", "vllm:time_to_first_token_seconds"),
    ("vllm-v0", "vllm:time_per_output_token_seconds"),
    ("vllm-v0", "vllm:e2e_request_latency_seconds"),
    ("sglang", "sglang:time_to_first_token_seconds"),
    ("sglang", "sglang:e2e_request_latency_seconds"),
], ids=lambda v: str(v))
def test_histogram_buckets_are_the_real_servers(fmt: str, histogram: str) -> None:
    def bounds(text: str) -> list[str]:
        return [s.labels["le"] for s in families(text)[histogram].samples
                if s.name.endswith("_bucket")]

    assert bounds(render(fmt)) == bounds((FIXTURES / FIXTURE_OF[fmt]).read_text())


def test_vllm_v1_reports_blocks_usage_and_queues_exactly() -> None:
    s = stats(total=27313, free=15795, running=24, waiting=3)
    fams = families(render("vllm", s))
    info = fams["vllm:cache_config_info"].samples[0]
    assert (info.labels["num_gpu_blocks"], info.labels["block_size"], info.value) == (
        "27313", "16", 1.0)
    usage = value(fams, "vllm:kv_cache_usage_perc")
    assert usage == s.kv_usage
    # V1's formula leaves the reserved null block out.
    assert round((1 - usage) * (27313 - 1)) == 15795
    assert value(fams, "vllm:num_requests_running", engine="0") == 24
    assert value(fams, "vllm:num_requests_waiting", engine="0") == 3


def test_vllm_v0_usage_counts_every_block() -> None:
    fams = families(render("vllm-v0", stats(total=7282, free=4369)))
    usage = value(fams, "vllm:gpu_cache_usage_perc")
    assert round((1 - usage) * 7282) == 4369
    info = fams["vllm:cache_config_info"].samples[0]
    assert (info.labels["num_gpu_blocks"], info.labels["block_size"]) == ("7282", "16")
    assert value(fams, "vllm:gpu_prefix_cache_hit_rate") == 0.6


def test_sglang_reports_tokens_and_pages() -> None:
    fams = families(render("sglang", stats(total=29453, free=20617, running=37, waiting=5)))
    total = value(fams, "sglang:max_total_num_tokens")
    page = value(fams, "sglang:page_size")
    usage = value(fams, "sglang:token_usage")
    assert (total, page) == (29453 * 16, 16)
    assert round(total * (1 - usage) / page) == 20617
    assert value(fams, "sglang:num_running_reqs") == 37
    assert value(fams, "sglang:num_queue_reqs") == 5
    assert value(fams, "sglang:num_retracted_requests") == 17


def test_vllm_v1_counts_requests_by_finished_reason_including_abort() -> None:
    fams = families(render("vllm"))
    got = {s.labels["finished_reason"]: s.value for s in fams["vllm:request_success"].samples
           if s.name == "vllm:request_success_total"}
    assert got == {"stop": 1402, "length": 118, "abort": 9, "error": 0}


def test_vllm_formats_expose_the_process_cpu_time() -> None:
    for fmt in ("vllm", "vllm-v0"):
        assert value(families(render(fmt)), "process_cpu_seconds") == 12.5


def test_histogram_observations_render_cumulatively_with_inclusive_bounds() -> None:
    recorder = FORMATS["vllm"].new_recorder()
    for v in (0.001, 0.0011, 0.3, 5000.0):
        recorder.ttft.observe(v)
    fams = families(render("vllm", recorder=recorder))
    samples = {(s.name, s.labels.get("le")): s.value
               for s in fams["vllm:time_to_first_token_seconds"].samples}
    assert samples[("vllm:time_to_first_token_seconds_bucket", "0.001")] == 1
    assert samples[("vllm:time_to_first_token_seconds_bucket", "0.005")] == 2
    assert samples[("vllm:time_to_first_token_seconds_bucket", "0.5")] == 3
    assert samples[("vllm:time_to_first_token_seconds_bucket", "2560.0")] == 3
    assert samples[("vllm:time_to_first_token_seconds_bucket", "+Inf")] == 4
    assert samples[("vllm:time_to_first_token_seconds_count", None)] == 4
    assert samples[("vllm:time_to_first_token_seconds_sum", None)] == pytest.approx(5000.3021)


def test_histogram_counts_each_value_once() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        h.observe(v)
    assert (h.counts, h.cumulative(), h.count, h.total) == ([2, 1, 1], [2, 3, 4], 4, 6.0)


@pytest.mark.parametrize("v", [0.0, 1.0, 17.0, 0.421682776801406, 1.8432e6, 2938406.0,
                               5.173653504e10, 1.7654320904410162e9, 1e-7, math.inf, -math.inf,
                               math.nan, -3.5])
def test_numbers_are_formatted_as_prometheus_client_does(v: float) -> None:
    assert format_value(v) == floatToGoString(v)  # type: ignore[no-untyped-call]


def test_label_values_are_escaped() -> None:
    info = ServerInfo(model_name='we"ird\\name\n', max_model_len=8192)
    text = FORMATS["vllm"].render(stats(), FORMATS["vllm"].new_recorder(), info, PROCESS)
    fams = families(text)
    assert fams["vllm:num_requests_running"].samples[0].labels["model_name"] == 'we"ird\\name\n'
