"""The simulator's presets: named deployments of the known models on the known GPUs.

The figures and the roofline that turns a preset into step times are `routing.physics`, shared
with `kvgate plan` and the gateway's TTFT model; this module only names deployments of them for
`kvgate sim --preset` and the fleet simulation, and describes one for `kvgate sim --describe`.

Besides the named ones, `lookup` knows every deployment of a known model on known GPUs by the
name `MODEL-[Nx]GPU[-fp8]` (e.g. `llama-3-70b-4xh100`, `llama-3-8b-h200-fp8`): N GPUs tensor
parallel, FP8 weights and KV cache with `-fp8`, vLLM's defaults otherwise. `kvgate plan` names the
fleets it proposes that way, so `kvgate simulate --backends` runs them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from routing.physics import (
    A100_SXM,
    B200,
    GPUS,
    H100_SXM,
    H200_SXM,
    L4,
    L40S,
    LLAMA_3_2_1B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MODELS,
    QWEN_2_5_0_5B,
    REFERENCE_PRESET,
    Preset,
    deployment_name,
    derive,
)

__all__ = ["DEFAULT_PRESET", "PRESETS", "SMALL_PRESET", "Preset", "deployment_name", "describe",
           "lookup"]

DEFAULT_PRESET = REFERENCE_PRESET.name
SMALL_PRESET = "llama-3.2-1b-l40s"  # the small-model pool

PRESETS: Mapping[str, Preset] = MappingProxyType({
    p.name: p
    for p in (
        REFERENCE_PRESET,
        # The same model on slower GPUs, for heterogeneous fleets (one model, mixed speeds).
        Preset("llama-3-8b-a100", LLAMA_3_8B, A100_SXM),
        Preset("llama-3-8b-l40s", LLAMA_3_8B, L40S),
        Preset("llama-3-8b-l4", LLAMA_3_8B, L4),
        # And on the newer ones.
        Preset("llama-3-8b-h200", LLAMA_3_8B, H200_SXM),
        Preset("llama-3-8b-b200", LLAMA_3_8B, B200),
        # Memory utilization 1.0 gives the classic back-of-envelope: 160 GB - 141 GB of weights
        # (less the activations and CUDA graphs); at vLLM's 0.9 the weights leave too little.
        Preset("llama-3-70b-2xh100", LLAMA_3_70B, H100_SXM, num_gpus=2,
               gpu_memory_utilization=1.0),
        Preset("llama-3-70b-4xh100", LLAMA_3_70B, H100_SXM, num_gpus=4),
        Preset("llama-3-70b-2xh100-fp8", LLAMA_3_70B, H100_SXM, num_gpus=2, fp8_weights=True,
               fp8_kv_cache=True),
        Preset("llama-3.2-1b-l40s", LLAMA_3_2_1B, L40S),
        Preset("qwen2.5-0.5b-l4", QWEN_2_5_0_5B, L4),
    )
})


def lookup(name: str) -> Preset | None:
    """The named preset, or the deployment `MODEL-[Nx]GPU[-fp8]` names; None when it is neither
    (or the weights leave it no KV cache)."""
    if name in PRESETS:
        return PRESETS[name]
    for model_name, model in MODELS.items():
        if not name.startswith(model_name + "-"):
            continue
        rest = name[len(model_name) + 1:]
        fp8 = rest.endswith("-fp8")
        rest = rest.removesuffix("-fp8")
        count, sep, gpu = rest.partition("x")
        if not (sep and count.isdigit() and int(count) >= 1):
            count, gpu = "1", rest
        if gpu not in GPUS:
            continue
        preset = Preset(name, model, GPUS[gpu], num_gpus=int(count), fp8_weights=fp8,
                        fp8_kv_cache=fp8)
        try:
            derive(preset)
        except ValueError:
            return None
        return preset
    return None


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
        f" x {1 if preset.fp8_weights else model.bytes_per_param} bytes)",
        f"  GPU memory         {preset.num_gpus * gpu.hbm_bytes / 1e9:.0f} GB"
        f" x utilization {preset.gpu_memory_utilization:g}, less activations"
        f" {d.activation_bytes / 1e9:.2f} GB and CUDA graphs {d.cuda_graph_bytes / 1e9:.2f} GB"
        f" a GPU -> KV cache {d.kv_cache_bytes / 1e9:.1f} GB ({d.kv_cache_bytes / gib:.1f} GiB)",
        f"  KV per token       {d.kv_bytes_per_token} bytes ({d.kv_bytes_per_token / 1024:.0f} KiB:"
        f" 2 x {model.num_layers} layers x {model.num_kv_heads} KV heads x {model.head_dim}"
        f" x {1 if preset.fp8_kv_cache else model.kv_bytes_per_element} bytes)",
        f"  KV blocks          {d.num_gpu_blocks} of {preset.block_size} tokens"
        f" (one reserved) = {d.kv_tokens_capacity()} tokens",
        f"  4k-token sequence  {per_seq_4k / 1e9:.2f} GB of KV;"
        f" {d.sequences_that_fit(4096)} fit at once",
        f"  effective          {d.effective_bandwidth / 1e12:.2f} TB/s"
        f" ({preset.bandwidth_efficiency:.0%} of bandwidth),"
        f" {d.effective_flops / 1e12:.0f} TFLOP/s ({preset.flops_efficiency:.0%} of dense"
        f" {'FP8' if d.effective_flops != d.attention_flops else 'bf16'})",
        "  tensor parallel    "
        + (f"{2 * model.num_layers} all-reduces a step over {gpu.interconnect}:"
           f" {d.allreduce_fixed_s * 1e3:.2f} ms + {d.allreduce_per_token_s * 1e6:.2f} us a token"
           if preset.num_gpus > 1 else "none (one GPU)"),
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
