"""Presets and the step-time physics: the figures each deployment gives, and their monotonicity."""

from __future__ import annotations

import dataclasses

import pytest

from loadtest.fleetsim.backends import parse_fleet
from loadtest.sim.presets import (
    DEFAULT_PRESET,
    PRESETS,
    SMALL_PRESET,
    deployment_name,
    describe,
    lookup,
)
from routing.physics import attention_pairs, derive, step_time

LLAMA_8B = PRESETS["llama-3-8b-h100"]
LLAMA_70B = PRESETS["llama-3-70b-2xh100"]


def test_the_default_and_small_presets_exist() -> None:
    assert DEFAULT_PRESET == "llama-3-8b-h100"
    assert PRESETS[DEFAULT_PRESET].model_name == "llama-3-8b"
    small = PRESETS[SMALL_PRESET]
    assert small.model.num_params < PRESETS[DEFAULT_PRESET].model.num_params / 4


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_vllm_default_scheduler_settings_and_room_for_a_full_context(
    name: str,
) -> None:
    preset = PRESETS[name]
    d = derive(preset)
    assert preset.block_size == 16
    assert (preset.max_num_seqs, preset.max_num_batched_tokens) == (256, 8192)
    assert d.kv_tokens_capacity() == (d.num_gpu_blocks - 1) * preset.block_size
    assert d.kv_tokens_capacity() >= preset.max_model_len
    assert preset.name in describe(preset)
    assert str(d.num_gpu_blocks) in describe(preset)


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token"),
    [
        pytest.param("llama-3-8b-h100", 2 * 32 * 8 * 128 * 2, id="llama-3-8b: 128 KiB per token"),
        pytest.param("llama-3-70b-2xh100", 2 * 80 * 8 * 128 * 2, id="llama-3-70b: 320 KiB"),
    ],
)
def test_kv_bytes_per_token_is_two_times_layers_kv_heads_head_dim_and_dtype_bytes(
    name: str, kv_bytes_per_token: int
) -> None:
    assert derive(PRESETS[name]).kv_bytes_per_token == kv_bytes_per_token


def test_llama_8b_on_h100_gets_90_percent_of_memory_less_weights_activations_and_graphs() -> None:
    """vLLM's accounting: the KV cache is what utilization x memory leaves after the weights, the
    profile run's activation peak and the CUDA graphs' memory."""
    d = derive(LLAMA_8B)
    assert d.kv_cache_bytes == pytest.approx(
        80e9 * 0.9 - 8.03e9 * 2 - d.activation_bytes - d.cuda_graph_bytes)
    assert 0.5e9 <= d.activation_bytes <= 2e9 and 0 < d.cuda_graph_bytes <= 1e9
    assert 25_000 <= d.num_gpu_blocks <= 27_000


def test_llama_70b_on_two_h100_leaves_about_15_gb_and_fits_about_11_sequences_of_4k() -> None:
    d = derive(LLAMA_70B)
    assert 14e9 <= d.kv_cache_bytes <= 17e9
    assert 1.3e9 <= 4096 * d.kv_bytes_per_token <= 1.4e9
    assert 10 <= d.sequences_that_fit(4096) <= 12


def test_memory_utilization_is_a_share_of_everything_the_engine_uses() -> None:
    """At vLLM's default 0.9, 70B in bf16 on two H100s leaves no KV cache at all: 144 GB less
    141 GB of weights less the activations and CUDA graphs of each GPU."""
    with pytest.raises(ValueError, match="no memory for the KV cache"):
        derive(dataclasses.replace(LLAMA_70B, gpu_memory_utilization=0.9))


def test_fp8_halves_the_weights_and_doubles_the_kv_blocks() -> None:
    bf16 = derive(PRESETS["llama-3-8b-h100"])
    fp8 = derive(dataclasses.replace(PRESETS["llama-3-8b-h100"], fp8_weights=True,
                                     fp8_kv_cache=True))
    assert fp8.weight_bytes == pytest.approx(bf16.weight_bytes / 2)
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token // 2
    assert fp8.num_gpu_blocks > 2 * bf16.num_gpu_blocks  # the weights' half goes to KV too
    assert fp8.decode_step_s(8, 8000) < 0.7 * bf16.decode_step_s(8, 8000)


def test_fp8_weights_compute_faster_only_on_gpus_with_fp8_tensor_cores() -> None:
    def prefill(gpu: str, fp8: bool) -> float:
        preset = PRESETS[f"llama-3-8b-{gpu}"]
        return derive(dataclasses.replace(preset, fp8_weights=fp8)).prefill_step_s(8192)

    assert prefill("h100", True) < 0.7 * prefill("h100", False)
    assert prefill("a100", True) == pytest.approx(prefill("a100", False), rel=0.02)


@pytest.mark.parametrize(
    ("gpus", "low_ms", "high_ms"),
    [
        pytest.param(2, 1.0, 2.0, id="TP2: 160 all-reduces of 2 ring steps each"),
        pytest.param(4, 3.5, 5.5, id="TP4: of 6 ring steps each"),
    ],
)
def test_tensor_parallel_decode_pays_the_all_reduce_latency_of_every_layer(
    gpus: int, low_ms: float, high_ms: float
) -> None:
    preset = dataclasses.replace(PRESETS["llama-3-70b-4xh100"], num_gpus=gpus,
                                 gpu_memory_utilization=1.0)
    d = derive(preset)
    assert d.allreduce_fixed_s == pytest.approx(
        2 * 80 * 2 * (gpus - 1) * preset.gpu.link_latency_s)
    assert low_ms <= 1e3 * d.allreduce_fixed_s <= high_ms
    no_links = derive(dataclasses.replace(preset, gpu=dataclasses.replace(
        preset.gpu, link_latency_s=0.0, link_bandwidth=1e30)))
    assert d.decode_step_s(8, 8000) - no_links.decode_step_s(8, 8000) == pytest.approx(
        d.allreduce_fixed_s + 8 * d.allreduce_per_token_s)


def test_pcie_all_reduces_cost_more_than_nvlink_ones() -> None:
    nvlink = derive(PRESETS["llama-3-70b-4xh100"])
    pcie = derive(dataclasses.replace(PRESETS["llama-3-70b-4xh100"], gpu=dataclasses.replace(
        PRESETS["llama-3-70b-4xh100"].gpu, link_bandwidth=32e9, link_latency_s=10e-6)))
    assert pcie.allreduce_per_token_s > 10 * nvlink.allreduce_per_token_s


def test_tensor_parallel_adds_up_bandwidth_and_flops_over_the_gpus() -> None:
    d = derive(LLAMA_70B)
    gpu, p = LLAMA_70B.gpu, LLAMA_70B
    assert d.effective_bandwidth == pytest.approx(2 * gpu.bandwidth * p.bandwidth_efficiency)
    assert d.effective_flops == pytest.approx(2 * gpu.flops * p.flops_efficiency)


@pytest.mark.parametrize(
    ("batch", "low_ms", "high_ms"),
    [
        pytest.param(1, 7.0, 8.5, id="batch 1 is about 8 ms: streaming the weights"),
        pytest.param(64, 10.0, 12.5, id="batch 64 at 1k context is about 11 ms"),
    ],
)
def test_llama_8b_decode_step_times(batch: int, low_ms: float, high_ms: float) -> None:
    assert low_ms <= 1e3 * derive(LLAMA_8B).decode_step_s(batch, batch * 1024) <= high_ms


def test_llama_8b_prefills_tens_of_thousands_of_tokens_per_second() -> None:
    d = derive(LLAMA_8B)
    assert 10_000 <= d.prefill_tokens_per_s(2048) <= 100_000
    assert d.prefill_tokens_per_s(8192) < d.prefill_tokens_per_s(2048)  # attention grows


@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        pytest.param((0, 0, 1, 1000), (0, 0, 64, 64_000), id="decode grows with batch"),
        pytest.param((0, 0, 64, 64_000), (0, 0, 64, 256_000), id="decode grows with context"),
        pytest.param((0, 0, 256, 0), (0, 0, 512, 0), id="large batches turn compute-bound"),
        pytest.param((4096, attention_pairs(0, 4096), 0, 0),
                     (8192, attention_pairs(0, 8192), 0, 0), id="prefill grows with tokens"),
        pytest.param((1024, attention_pairs(0, 1024), 0, 0),
                     (1024, attention_pairs(6000, 1024), 0, 0),
                     id="a chunk after a long prefix costs more attention"),
    ],
)
def test_step_time_grows_with_the_work_in_the_step(
    smaller: tuple[int, int, int, int], larger: tuple[int, int, int, int]
) -> None:
    assert step_time(LLAMA_8B, *smaller) < step_time(LLAMA_8B, *larger)


def test_an_empty_step_costs_the_fixed_overhead_plus_one_pass_over_the_weights() -> None:
    d = derive(LLAMA_8B)
    expected = LLAMA_8B.step_overhead_s + d.weight_bytes / d.effective_bandwidth
    assert step_time(LLAMA_8B, 0, 0, 0, 0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prior", "chunk", "pairs"),
    [
        pytest.param(0, 1, 1, id="one token attends to itself"),
        pytest.param(0, 4, 10, id="causal: 1 + 2 + 3 + 4"),
        pytest.param(10, 2, 23, id="after 10 tokens: 11 + 12"),
    ],
)
def test_attention_pairs_count_causal_query_key_pairs(prior: int, chunk: int, pairs: int) -> None:
    assert attention_pairs(prior, chunk) == pairs


@pytest.mark.parametrize(
    ("name", "gpus", "fp8"),
    [
        pytest.param("llama-3-8b-2xa100-fp8", 2, True, id="TP2 FP8 on A100"),
        pytest.param("llama-3-70b-8xh200", 8, False, id="TP8 on H200"),
        pytest.param("llama-3.2-1b-b200", 1, False, id="a model name with a dot"),
    ],
)
def test_any_deployment_of_a_known_model_on_known_gpus_is_a_preset_by_its_name(
    name: str, gpus: int, fp8: bool
) -> None:
    preset = lookup(name)
    assert preset is not None and preset.name == name
    assert (preset.num_gpus, preset.fp8_weights, preset.fp8_kv_cache) == (gpus, fp8, fp8)
    assert parse_fleet(f"2x{name}").presets == (preset, preset)


def test_deployment_names_spell_model_gpu_count_and_precision() -> None:
    assert deployment_name("llama-3-8b", "h100") == "llama-3-8b-h100"
    assert deployment_name("llama-3-70b", "h200", 4, fp8=True) == "llama-3-70b-4xh200-fp8"


def test_a_named_preset_is_itself_and_an_impossible_deployment_is_none() -> None:
    assert lookup("llama-3-70b-2xh100") is PRESETS["llama-3-70b-2xh100"]
    assert lookup("llama-3-70b-l4") is None  # the weights do not fit
    assert lookup("llama-3-8b-tpu") is None and lookup("gpt-9-h100") is None
    with pytest.raises(ValueError, match="MODEL-\\[Nx\\]GPU"):
        parse_fleet("llama-3-8b-tpu")
