"""Formats and versions with no sample in /work/shared/fixtures, written here from the servers'
real metric names, labels and HELP text: TensorRT-LLM on Triton, older llama.cpp, older SGLang,
vLLM data-parallel and before the usage rename, llm-d-inference-sim; and what is not metrics."""
# ruff: noqa: E501 - the payloads are exposition lines as servers write them, unwrapped.

from __future__ import annotations

import pytest

from routing.metrics import MetricsError, detect_family, parse_metrics, parse_slots, with_slots
from routing.metrics import vllm as vllm_format
from routing.state import BackendSnapshot

TRTLLM = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 1520
nv_inference_request_success{model="tensorrt_llm",version="1"} 1520
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 4
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 12
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 16
# HELP nv_trt_llm_runtime_memory_metrics TRT LLM runtime memory metrics
# TYPE nv_trt_llm_runtime_memory_metrics gauge
nv_trt_llm_runtime_memory_metrics{memory_type="pinned",model="tensorrt_llm",version="1"} 0
nv_trt_llm_runtime_memory_metrics{memory_type="gpu",model="tensorrt_llm",version="1"} 1.610236e+06
nv_trt_llm_runtime_memory_metrics{memory_type="cpu",model="tensorrt_llm",version="1"} 0
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.375
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 2340
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 3900
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6240
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} 812
# HELP nv_trt_llm_inflight_batcher_metrics TRT LLM inflight_batcher-specific metrics
# TYPE nv_trt_llm_inflight_batcher_metrics gauge
nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="micro_batch_id",model="tensorrt_llm",version="1"} 0
nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="generation_requests",model="tensorrt_llm",version="1"} 11
# HELP nv_trt_llm_general_metrics General TRT LLM metrics
# TYPE nv_trt_llm_general_metrics gauge
nv_trt_llm_general_metrics{general_type="iteration_counter",model="tensorrt_llm",version="1"} 80211
nv_trt_llm_general_metrics{general_type="timestamp",model="tensorrt_llm",version="1"} 1765432091
"""

# Before the "waiting" request type existed.
TRTLLM_OLD = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 0
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 6239
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6240
"""

# llama-server builds that still exported the KV cache gauges.
LLAMACPP_OLD = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 48213
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 21.387
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1.23457e+06
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 2048
# HELP llamacpp:requests_processing Number of request processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of request deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""
# Their /slots: a numeric `state` instead of `is_processing`, `next_token` an object, no n_past.
LLAMACPP_OLD_SLOTS = b"""[
 {"id": 0, "n_ctx": 4096, "state": 1, "model": "llama-3-8b", "prompt": "Hello",
  "next_token": {"has_next_token": true, "n_remain": -1, "n_decoded": 12, "stopped_eos": false}},
 {"id": 1, "n_ctx": 4096, "state": 0, "model": "llama-3-8b", "prompt": "",
  "next_token": {"has_next_token": false, "n_remain": -1, "n_decoded": 0, "stopped_eos": false}}
]"""

# SGLang before v0.5.11: capacity only as labels of its info gauge.
SGLANG_CACHE_CONFIG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 8.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 0.25
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0"} 0.5
# HELP sglang:cache_config_info Information of the LLMEngine CacheConfig
# TYPE sglang:cache_config_info gauge
sglang:cache_config_info{model_name="Qwen/Qwen2.5-7B-Instruct",num_pages="11147",page_size="64"} 1.0
"""

# A vLLM V1 server with two data-parallel engines: one series per engine label.
VLLM_DP = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 10.0
vllm:num_requests_running{engine="1",model_name="m"} 6.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
vllm:num_preemptions_total{engine="1",model_name="m"} 4.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="1001",swap_space="4"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",num_gpu_blocks="1001",swap_space="4"} 1.0
"""

# vLLM V1 before `vllm:gpu_cache_usage_perc` was renamed (the engine label gives V1 away), with
# the prefix-cache counters' old names too.
VLLM_V1_OLD_NAMES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 250.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0",num_gpu_blocks="2001"} 1.0
"""

# llm-d-inference-sim: vLLM's names, no engine label, a two-label cache config, `finish_reason`.
LLMD_SIM = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1
# HELP vllm:kv_cache_usage_perc Prometheus metric for the fraction of KV-cache blocks currently in use (from 0 to 1).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="Qwen/Qwen2-0.5B"} 0.125
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="lora1",waiting_lora_adapters=""} 1.765432e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="lora1,lora2",waiting_lora_adapters="lora3"} 1.765433e+09
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="Qwen/Qwen2-0.5B"} 3
# HELP vllm:num_requests_waiting Prometheus metric for the number of queued requests.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="Qwen/Qwen2-0.5B"} 1
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="Qwen/Qwen2-0.5B"} 64
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="Qwen/Qwen2-0.5B"} 256
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{finish_reason="stop",model_name="Qwen/Qwen2-0.5B"} 12
"""
# An older simulator: the pre-rename usage name, and no request finished yet.
LLMD_SIM_OLD = """\
# HELP vllm:gpu_cache_usage_perc Prometheus metric for the fraction of KV-cache blocks currently in use (from 0 to 1).
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1
"""


def snap(text: str, format: str | None = None) -> BackendSnapshot:
    return parse_metrics(text, taken_at=3.0, format=format)


def fields(s: BackendSnapshot, *names: str) -> dict[str, object]:
    return {name: getattr(s, name) for name in names}


KV = ("kv_total_blocks", "kv_free_blocks", "kv_usage", "block_size")
LOAD = ("running", "waiting", "preemptions")


@pytest.mark.parametrize(
    ("text", "family", "expected"),
    [
        pytest.param(TRTLLM, "trtllm", dict(
            format="trtllm", kv_total_blocks=6240, kv_free_blocks=3900, kv_usage=0.375,
            block_size=64, running=12, waiting=4, preemptions=None, models=None),
            id="TensorRT-LLM: blocks from kv_cache_block_type, scheduled running, waiting queued"),
        pytest.param(TRTLLM_OLD, "trtllm", dict(
            format="trtllm", kv_total_blocks=6240, kv_free_blocks=6239, kv_usage=1 / 6240,
            block_size=64, running=1, waiting=None),
            id="TensorRT-LLM without fraction or waiting: usage from used/max, waiting unknown"),
        pytest.param(SGLANG_CACHE_CONFIG, "sglang", dict(
            format="sglang", kv_total_blocks=11147, kv_free_blocks=round(0.75 * 11147 * 64) // 64,
            kv_usage=0.25, block_size=64, running=8, waiting=2, prefix_cache_hit_rate=0.5,
            models=("Qwen/Qwen2.5-7B-Instruct",)),
            id="older SGLang: capacity from sglang:cache_config_info labels"),
        pytest.param(VLLM_DP, "vllm", dict(
            format="vllm", kv_total_blocks=2002, kv_free_blocks=500 + 750, kv_usage=0.375,
            block_size=16, running=16, waiting=3, preemptions=7, models=("m",)),
            id="vLLM data-parallel: per-engine free blocks (one reserved each), summed"),
        pytest.param(VLLM_V1_OLD_NAMES, "vllm", dict(
            format="vllm", kv_total_blocks=2001, kv_free_blocks=1500, kv_usage=0.25,
            block_size=32, running=4, waiting=0, prefix_cache_hit_rate=0.25),
            id="vLLM V1 before the rename: old names read, still one reserved block"),
        pytest.param(LLMD_SIM, "vllm", dict(
            format="vllm", kv_total_blocks=1024, kv_free_blocks=896, kv_usage=0.125,
            block_size=16, running=3, waiting=1, prefix_cache_hit_rate=0.25,
            models=("Qwen/Qwen2-0.5B", "lora1", "lora2", "lora3")),
            id="llm-d-inference-sim: no reserved block, adapters from the newest lora info"),
        pytest.param(LLMD_SIM_OLD, "vllm", dict(
            format="vllm", kv_total_blocks=100, kv_free_blocks=75, kv_usage=0.25, running=0),
            id="older llm-d-inference-sim: pre-rename usage name, known by its cache config"),
        pytest.param(LLAMACPP_OLD, "llamacpp", dict(
            format="llamacpp", kv_usage=0.25, kv_total_blocks=None, kv_free_blocks=None,
            running=1, waiting=0, prefix_cache_hit_rate=None),
            id="older llama.cpp: usage ratio, capacity unknown without /slots"),
    ],
)
def test_synthetic_payload_parses(text: str, family: str, expected: dict[str, object]) -> None:
    assert detect_family(text) == family
    snapshot = snap(text)
    got = fields(snapshot, *expected)
    for name, value in expected.items():
        if isinstance(value, float):
            assert got[name] == pytest.approx(value), name
        else:
            assert got[name] == value, name


def test_older_llamacpp_slots_without_n_past_take_usage_from_the_metrics_ratio() -> None:
    slots = parse_slots(LLAMACPP_OLD_SLOTS)
    assert (slots.total_tokens, slots.used_tokens, slots.processing) == (8192, None, 1)
    snapshot = with_slots(snap(LLAMACPP_OLD), slots)
    assert fields(snapshot, *KV) == dict(
        kv_total_blocks=8192, kv_free_blocks=6144, kv_usage=0.25, block_size=1
    )


def test_llamacpp_slots_without_usage_anywhere_leave_kv_unknown() -> None:
    current = snap("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n")
    snapshot = with_slots(current, parse_slots(LLAMACPP_OLD_SLOTS))
    assert fields(snapshot, *KV) == dict.fromkeys(KV)
    assert snapshot.running == 1


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<html>nope</html>", id="not JSON"),
        pytest.param(b"{}", id="not an array"),
        pytest.param(b"[]", id="no slots"),
        pytest.param(b'[{"id": 0, "is_processing": true}]', id="no n_ctx"),
    ],
)
def test_slots_that_are_not_slots_are_an_error(body: bytes) -> None:
    with pytest.raises(MetricsError):
        parse_slots(body)


@pytest.mark.parametrize(
    ("text", "simulator"),
    [
        pytest.param('vllm:request_success_total{finish_reason="stop",model_name="m"} 1\n', True,
                     id="finish_reason label: the simulator"),
        pytest.param('vllm:cache_config_info{block_size="16",num_gpu_blocks="8"} 1\n', True,
                     id="two-label cache config: the simulator"),
        pytest.param('vllm:request_success_total{engine="0",finished_reason="stop"} 1\n', False,
                     id="finished_reason label: vLLM"),
        pytest.param('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="8",'
                     'swap_space="4"} 1\n', False, id="full cache config: vLLM"),
    ],
)
def test_llm_d_inference_sim_is_told_from_vllm(text: str, simulator: bool) -> None:
    assert vllm_format.is_simulator(vllm_format.read(text.encode())) is simulator


def test_vllm_prefers_the_current_usage_name_over_the_deprecated_one() -> None:
    text = VLLM_V1_OLD_NAMES + 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75\n'
    assert snap(text).kv_usage == 0.75


def test_nan_usage_is_unknown_not_zero() -> None:
    text = VLLM_DP.replace('vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25',
                           'vllm:kv_cache_usage_perc{engine="1",model_name="m"} NaN')
    snapshot = snap(text)
    assert fields(snapshot, "kv_total_blocks", "kv_free_blocks", "kv_usage") == dict.fromkeys(
        ("kv_total_blocks", "kv_free_blocks", "kv_usage")
    )
    assert snapshot.running == 16


def test_configured_v0_reads_a_v1_payload_without_the_reserved_block() -> None:
    assert snap(VLLM_V1_OLD_NAMES, format="vllm-v0").kv_free_blocks == 1501  # 0.75 * 2001
    assert snap(VLLM_V1_OLD_NAMES, format="vllm").kv_free_blocks == 1500  # 0.75 * (2001 - 1)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("<!doctype html><html><body>502 Bad Gateway</body></html>", id="an HTML page"),
        pytest.param('{"object": "error", "message": "Not Found"}', id="JSON"),
        pytest.param("\x00\x9f\ufffd\ufffd garbage \x07", id="binary junk"),
        pytest.param("# HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.5\n",
                     id="another exporter's metrics"),
        pytest.param("# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n",
                     id="a family declared with no samples"),
    ],
)
def test_a_payload_no_server_wrote_is_an_error(text: str) -> None:
    with pytest.raises(MetricsError):
        snap(text)


def test_an_unknown_configured_format_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown metrics format"):
        snap(VLLM_DP, format="vllm-v2")
