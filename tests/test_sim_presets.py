"""Presets and the step-time physics: the figures each deployment gives, and their monotonicity."""

from __future__ import annotations

import pytest

from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, SMALL_PRESET, describe
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


def test_llama_8b_on_h100_gets_about_27k_blocks_from_90_percent_of_memory_minus_weights() -> None:
    d = derive(LLAMA_8B)
    assert d.kv_cache_bytes == pytest.approx(80e9 * 0.9 - 8.03e9 * 2)
    assert 25_000 <= d.num_gpu_blocks <= 30_000


def test_llama_70b_on_two_h100_leaves_about_20_gb_and_fits_about_15_sequences_of_4k() -> None:
    d = derive(LLAMA_70B)
    assert 18e9 <= d.kv_cache_bytes <= 20e9
    assert 1.3e9 <= 4096 * d.kv_bytes_per_token <= 1.4e9
    assert 13 <= d.sequences_that_fit(4096) <= 15


def test_tensor_parallel_adds_up_bandwidth_and_flops_over_the_gpus() -> None:
    d = derive(LLAMA_70B)
    gpu, p = LLAMA_70B.gpu, LLAMA_70B
    assert d.effective_bandwidth == pytest.approx(2 * gpu.bandwidth * p.bandwidth_efficiency)
    assert d.effective_flops == pytest.approx(2 * gpu.flops * p.flops_efficiency)


@pytest.mark.parametrize(
    ("batch", "low_ms", "high_ms"),
    [
        pytest.param(1, 5.5, 7.0, id="batch 1 is about 6 ms: streaming the weights"),
        pytest.param(64, 8.5, 11.5, id="batch 64 at 1k context is about 10 ms"),
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
