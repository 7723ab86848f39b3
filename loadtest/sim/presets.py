"""Model and GPU presets for the simulator, and the physics that turns them into step times.

A step of a vLLM-like engine runs every scheduled token through the model once. Its duration is

    fixed overhead
    + max(weight bytes / effective bandwidth, 2 * parameters * step tokens / effective FLOP/s)
    + KV bytes the decodes read / effective bandwidth
    + attention FLOPs of the prefill tokens / effective FLOP/s

where "effective" applies an efficiency factor to the datasheet figure (kernels reach ~80% of HBM
bandwidth and ~50% of dense bf16 FLOP/s in practice). The first `max` is the roofline of the dense
layers: a small batch streams all weights once (memory-bound), a large one is compute-bound.
Tensor parallelism splits weights, KV heads and FLOPs evenly over `num_gpus` GPUs, so bandwidth,
FLOP/s and memory add up across them (its all-reduce cost is left out).

The KV cache gets what memory utilization leaves after the weights, in blocks of `block_size`
tokens; as in vLLM, that count (`num_gpu_blocks`) includes one reserved null block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str  # the served model name, e.g. "llama-3-8b"
    num_params: float
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    bytes_per_param: int = 2  # bf16 weights
    kv_bytes_per_element: int = 2  # bf16 KV cache
    max_model_len: int = 8192


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    hbm_bytes: float
    bandwidth: float  # bytes/s
    flops: float  # dense bf16 FLOP/s


@dataclass(frozen=True, slots=True)
class Preset:
    """One simulated deployment: a model on `num_gpus` GPUs (tensor parallel) with vLLM settings."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int = 1
    gpu_memory_utilization: float = 0.9  # vLLM's default
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_overhead_s: float = 0.0004  # scheduler, sampling and launch time per step
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.5

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len


@dataclass(frozen=True, slots=True)
class Derived:
    """Figures that follow from a preset; `derive(preset)` computes them once."""

    kv_bytes_per_token: int
    weight_bytes: float
    kv_cache_bytes: float
    num_gpu_blocks: int  # includes vLLM's reserved null block
    effective_bandwidth: float  # bytes/s over all GPUs
    effective_flops: float  # FLOP/s over all GPUs
    dense_flops_per_token: float  # 2 * parameters
    attention_flops_per_pair: float  # per (query token, key token) pair, all layers
    step_overhead_s: float
    block_size: int

    def step_time(
        self,
        prefill_tokens: int,
        prefill_ctx_tokens: int,
        decode_seqs: int,
        decode_ctx_tokens: int,
    ) -> float:
        """Seconds one step takes.

        prefill_tokens: prompt (or recomputed) tokens computed this step.
        prefill_ctx_tokens: their attention work, as the number of (query, key) pairs: a chunk of
            c tokens after p cached or computed ones contributes `attention_pairs(p, c)`.
        decode_seqs: sequences computing one token each.
        decode_ctx_tokens: the KV tokens those decodes read, summed over the sequences.
        """
        tokens = prefill_tokens + decode_seqs
        dense = max(
            self.weight_bytes / self.effective_bandwidth,
            tokens * self.dense_flops_per_token / self.effective_flops,
        )
        kv_read = decode_ctx_tokens * self.kv_bytes_per_token / self.effective_bandwidth
        attention = prefill_ctx_tokens * self.attention_flops_per_pair / self.effective_flops
        return self.step_overhead_s + dense + kv_read + attention

    def decode_step_s(self, batch: int, ctx_tokens_total: int) -> float:
        """A step of `batch` decodes reading `ctx_tokens_total` KV tokens in all."""
        return self.step_time(0, 0, batch, ctx_tokens_total)

    def prefill_step_s(self, tokens: int) -> float:
        """A step that prefills one fresh prompt of `tokens` tokens and nothing else."""
        return self.step_time(tokens, attention_pairs(0, tokens), 0, 0)

    def prefill_tokens_per_s(self, tokens: int = 2048) -> float:
        return tokens / self.prefill_step_s(tokens)

    def kv_tokens_capacity(self) -> int:
        """Tokens the KV cache holds, not counting the null block."""
        return (self.num_gpu_blocks - 1) * self.block_size

    def sequences_that_fit(self, tokens_per_seq: int) -> int:
        blocks_per_seq = -(-tokens_per_seq // self.block_size)
        return (self.num_gpu_blocks - 1) // blocks_per_seq


def attention_pairs(prior_tokens: int, chunk_tokens: int) -> int:
    """(query, key) pairs of causal attention for `chunk_tokens` new tokens after `prior_tokens`."""
    return chunk_tokens * prior_tokens + chunk_tokens * (chunk_tokens + 1) // 2


def derive(preset: Preset) -> Derived:
    model, gpu = preset.model, preset.gpu
    kv_bytes_per_token = (
        2 * model.num_layers * model.num_kv_heads * model.head_dim * model.kv_bytes_per_element
    )
    weight_bytes = model.num_params * model.bytes_per_param
    kv_cache_bytes = preset.num_gpus * gpu.hbm_bytes * preset.gpu_memory_utilization - weight_bytes
    num_gpu_blocks = int(kv_cache_bytes // (kv_bytes_per_token * preset.block_size))
    if num_gpu_blocks < 2:
        raise ValueError(f"preset {preset.name}: the weights leave no memory for the KV cache")
    return Derived(
        kv_bytes_per_token=kv_bytes_per_token,
        weight_bytes=weight_bytes,
        kv_cache_bytes=kv_cache_bytes,
        num_gpu_blocks=num_gpu_blocks,
        effective_bandwidth=preset.num_gpus * gpu.bandwidth * preset.bandwidth_efficiency,
        effective_flops=preset.num_gpus * gpu.flops * preset.flops_efficiency,
        dense_flops_per_token=2.0 * model.num_params,
        # QK^T and AV: two multiply-adds per head dimension per query head per layer.
        attention_flops_per_pair=4.0 * model.num_layers * model.num_attention_heads
        * model.head_dim,
        step_overhead_s=preset.step_overhead_s,
        block_size=preset.block_size,
    )


def step_time(
    preset: Preset,
    prefill_tokens: int,
    prefill_ctx_tokens: int,
    decode_seqs: int,
    decode_ctx_tokens: int,
) -> float:
    """`derive(preset).step_time(...)`; callers on a hot path keep the `Derived` instead."""
    return derive(preset).step_time(prefill_tokens, prefill_ctx_tokens, decode_seqs,
                                    decode_ctx_tokens)


H100_SXM = GpuSpec("H100 SXM 80GB", hbm_bytes=80e9, bandwidth=3.35e12, flops=989e12)
L40S = GpuSpec("L40S 48GB", hbm_bytes=48e9, bandwidth=864e9, flops=362e12)
L4 = GpuSpec("L4 24GB", hbm_bytes=24e9, bandwidth=300e9, flops=121e12)
A100_SXM = GpuSpec("A100 SXM 80GB", hbm_bytes=80e9, bandwidth=2.039e12, flops=312e12)

LLAMA_3_8B = ModelSpec("llama-3-8b", num_params=8.03e9, num_layers=32, num_attention_heads=32,
                       num_kv_heads=8, head_dim=128)
LLAMA_3_70B = ModelSpec("llama-3-70b", num_params=70.6e9, num_layers=80, num_attention_heads=64,
                        num_kv_heads=8, head_dim=128)
LLAMA_3_2_1B = ModelSpec("llama-3.2-1b", num_params=1.24e9, num_layers=16, num_attention_heads=32,
                         num_kv_heads=8, head_dim=64, max_model_len=32768)
QWEN_2_5_0_5B = ModelSpec("qwen2.5-0.5b", num_params=0.494e9, num_layers=24,
                          num_attention_heads=14, num_kv_heads=2, head_dim=64, max_model_len=32768)

DEFAULT_PRESET = "llama-3-8b-h100"
SMALL_PRESET = "llama-3.2-1b-l40s"  # the small-model pool

PRESETS: Mapping[str, Preset] = MappingProxyType({
    p.name: p
    for p in (
        Preset("llama-3-8b-h100", LLAMA_3_8B, H100_SXM),
        # The same model on slower GPUs, for heterogeneous fleets (one model, mixed speeds).
        Preset("llama-3-8b-a100", LLAMA_3_8B, A100_SXM),
        Preset("llama-3-8b-l40s", LLAMA_3_8B, L40S),
        Preset("llama-3-8b-l4", LLAMA_3_8B, L4),
        # Memory utilization 1.0 gives the classic back-of-envelope: 160 GB - 141 GB of weights.
        Preset("llama-3-70b-2xh100", LLAMA_3_70B, H100_SXM, num_gpus=2,
               gpu_memory_utilization=1.0),
        Preset("llama-3.2-1b-l40s", LLAMA_3_2_1B, L40S),
        Preset("qwen2.5-0.5b-l4", QWEN_2_5_0_5B, L4),
    )
})


def describe(preset: Preset) -> str:
    """The derived figures of `preset`, for `kvgate sim --describe`."""
    d = derive(preset)
    model, gpu = preset.model, preset.gpu
    gib = 2.0**30
    ctx = 1024
    decode_ms = {b: 1e3 * d.decode_step_s(b, b * ctx) for b in (1, 64, 256)}
    per_seq_4k = 4096 * d.kv_bytes_per_token
    lines = [
        f"preset {preset.name}: {model.name} on {preset.num_gpus} x {gpu.name}"
        + (f" (tensor parallel {preset.num_gpus})" if preset.num_gpus > 1 else ""),
        f"  weights            {d.weight_bytes / 1e9:.1f} GB ({model.num_params / 1e9:.2f}B params"
        f" x {model.bytes_per_param} bytes)",
        f"  GPU memory         {preset.num_gpus * gpu.hbm_bytes / 1e9:.0f} GB"
        f" x utilization {preset.gpu_memory_utilization:g}"
        f" -> KV cache {d.kv_cache_bytes / 1e9:.1f} GB ({d.kv_cache_bytes / gib:.1f} GiB)",
        f"  KV per token       {d.kv_bytes_per_token} bytes ({d.kv_bytes_per_token / 1024:.0f} KiB:"
        f" 2 x {model.num_layers} layers x {model.num_kv_heads} KV heads x {model.head_dim}"
        f" x {model.kv_bytes_per_element} bytes)",
        f"  KV blocks          {d.num_gpu_blocks} of {preset.block_size} tokens"
        f" (one reserved) = {d.kv_tokens_capacity()} tokens",
        f"  4k-token sequence  {per_seq_4k / 1e9:.2f} GB of KV;"
        f" {d.sequences_that_fit(4096)} fit at once",
        f"  effective          {d.effective_bandwidth / 1e12:.2f} TB/s"
        f" ({preset.bandwidth_efficiency:.0%} of bandwidth),"
        f" {d.effective_flops / 1e12:.0f} TFLOP/s ({preset.flops_efficiency:.0%} of dense bf16)",
        "  decode step        "
        + ", ".join(f"{ms:.2f} ms at batch {b}" for b, ms in decode_ms.items())
        + f" ({ctx} tokens of context each)",
        f"  single stream      {1e3 / decode_ms[1]:.0f} tokens/s modeled;"
        f" ceiling {d.effective_bandwidth / preset.bandwidth_efficiency / d.weight_bytes:.0f}"
        " tokens/s (aggregate bandwidth / weight bytes)",
        f"  prefill            {d.prefill_tokens_per_s(2048):,.0f} tokens/s for a 2k prompt,"
        f" {d.prefill_tokens_per_s(preset.max_num_batched_tokens):,.0f} tokens/s for"
        f" {preset.max_num_batched_tokens}",
        f"  scheduler          max_num_seqs {preset.max_num_seqs}, max_num_batched_tokens"
        f" {preset.max_num_batched_tokens}, max_model_len {preset.max_model_len},"
        f" step overhead {preset.step_overhead_s * 1e3:g} ms",
    ]
    return "\n".join(lines)
