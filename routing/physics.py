"""The physics of a GPU serving a model: datasheet figures, the roofline of one engine step, and
the reference profile the TTFT model starts from. Pure values and functions; the simulator
(`loadtest.sim`), `kvgate plan` (`routing.plan`) and the TTFT model (`routing.ttft`) import them
and restate none.

A step of a vLLM-like engine runs every scheduled token through the model once. Its duration is

    fixed overhead
    + max(weight bytes / effective bandwidth, 2 * parameters * step tokens / effective FLOP/s)
    + KV bytes the decodes read / effective bandwidth
    + attention FLOPs of the prefill tokens / effective FLOP/s
    + tensor-parallel all-reduces

where "effective" applies a kernel efficiency to the datasheet figure (`BANDWIDTH_EFFICIENCY` of
HBM bandwidth, `FLOPS_EFFICIENCY` of dense FLOP/s, what serving kernels reach in practice). The
first `max` is the roofline of the dense layers: a small batch streams all weights once
(memory-bound), a large one is compute-bound. Tensor parallelism over `num_gpus` GPUs splits
weights, KV heads and FLOPs evenly, so bandwidth, FLOP/s and memory add up across them, and costs
two all-reduces of the step's activations (tokens x hidden size x 2 bytes) per layer, after the
attention and after the MLP. A ring all-reduce over n GPUs takes

    2 (n - 1) / n x bytes / link bandwidth + 2 (n - 1) x link latency

(each of its 2 (n - 1) steps passes a 1/n share to the next GPU), with the GPU's interconnect:
NVLink on SXM parts, PCIe on the others.

FP8 weights (`fp8_weights`) halve the bytes a step reads and, on GPUs with FP8 tensor cores, run
the dense layers at the FP8 FLOP/s; an FP8 KV cache (`fp8_kv_cache`) halves the bytes per KV token,
so the same memory holds twice the blocks and a decode reads half the bytes.

Memory follows vLLM's accounting: `gpu_memory_utilization` is the share of each GPU's memory the
engine may use for everything; the KV cache gets what is left of it after the weights, the
activation peak of a profile run (one step of `max_num_batched_tokens` tokens, plus the sampler's
logits for `max_num_seqs` sequences) and the memory CUDA graphs keep (`CUDA_GRAPH_BYTES` a GPU).
It is cut in blocks of `block_size` tokens; as in vLLM, that count (`num_gpu_blocks`) includes one
reserved null block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

# The two efficiencies, the step overhead and the NVLink latency are fitted to published engine
# benchmarks (loadtest/fidelity/published.json; docs/capacity-planning.md has the comparison).
BANDWIDTH_EFFICIENCY = 0.75  # share of datasheet HBM bandwidth that decode kernels reach
FLOPS_EFFICIENCY = 0.5  # share of datasheet dense FLOP/s that prefill and GEMMs reach
STEP_OVERHEAD_S = 0.0015  # per engine step: scheduler, sampling, launches, host sync
CUDA_GRAPH_BYTES = 0.5e9  # per GPU: what captured CUDA graphs and their pools keep
ACTIVATION_BYTES = 2  # bf16 activations (also what the all-reduces carry)
LOGIT_BYTES = 4  # the sampler's fp32 logits


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
    hidden_size: int = 0  # 0: attention heads x head dim
    intermediate_size: int = 0  # the MLP's; 0: 3.5 x hidden size, as in the Llama 3 family
    vocab_size: int = 128_256  # Llama 3's

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of every layer's KV heads: 2 x layers x KV heads x head dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def hidden(self) -> int:
        return self.hidden_size or self.num_attention_heads * self.head_dim

    @property
    def intermediate(self) -> int:
        return self.intermediate_size or int(3.5 * self.hidden)


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    hbm_bytes: float
    bandwidth: float  # bytes/s
    flops: float  # dense bf16 FLOP/s
    fp8_flops: float = 0.0  # dense FP8 FLOP/s; 0: no FP8 tensor cores (FP8 weights run as bf16)
    link_bandwidth: float = 32e9  # GPU-to-GPU bytes/s, one direction (default: PCIe 4.0 x16)
    link_latency_s: float = 10e-6  # per step of a ring all-reduce
    interconnect: str = "PCIe"


@dataclass(frozen=True, slots=True)
class Preset:
    """One deployment: a model on `num_gpus` GPUs (tensor parallel) with vLLM settings."""

    name: str
    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int = 1
    gpu_memory_utilization: float = 0.9  # vLLM's default
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_overhead_s: float = STEP_OVERHEAD_S
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    flops_efficiency: float = FLOPS_EFFICIENCY
    fp8_weights: bool = False
    fp8_kv_cache: bool = False

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
    effective_flops: float  # FLOP/s over all GPUs, of the dense layers
    dense_flops_per_token: float  # 2 * parameters
    attention_flops_per_pair: float  # per (query token, key token) pair, all layers
    step_overhead_s: float
    block_size: int
    attention_flops: float = 0.0  # FLOP/s over all GPUs for attention; 0: effective_flops
    activation_bytes: float = 0.0  # per GPU, the profile run's peak
    cuda_graph_bytes: float = 0.0  # per GPU
    allreduce_fixed_s: float = 0.0  # per step, the all-reduces' latency (0 without TP)
    allreduce_per_token_s: float = 0.0  # per step token, their transfer

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
        attention = prefill_ctx_tokens * self.attention_flops_per_pair / (
            self.attention_flops or self.effective_flops)
        allreduce = self.allreduce_fixed_s + tokens * self.allreduce_per_token_s if tokens else 0.0
        return self.step_overhead_s + dense + kv_read + attention + allreduce

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


def weight_bytes(preset: Preset) -> float:
    """All the replica's weights: one byte a parameter with FP8 weights."""
    return preset.model.num_params * (1 if preset.fp8_weights else preset.model.bytes_per_param)


def activation_peak_bytes(preset: Preset) -> float:
    """Per GPU, the profile run's activation peak (module docstring): a step of
    `max_num_batched_tokens` tokens holds the MLP's gate and up projections (split over the GPUs)
    and a few hidden-size buffers (the residual stream, replicated), and the sampler the fp32
    logits of `max_num_seqs` sequences."""
    m, n = preset.model, preset.num_gpus
    per_token = 2 * m.intermediate / n + 4 * m.hidden
    return (preset.max_num_batched_tokens * per_token * ACTIVATION_BYTES
            + preset.max_num_seqs * m.vocab_size * LOGIT_BYTES)


def allreduce_s(gpu: GpuSpec, num_gpus: int, nbytes: float) -> float:
    """One ring all-reduce of `nbytes` over `num_gpus` GPUs (module docstring); 0 on one GPU."""
    if num_gpus < 2:
        return 0.0
    return (2 * (num_gpus - 1) / num_gpus * nbytes / gpu.link_bandwidth
            + 2 * (num_gpus - 1) * gpu.link_latency_s)


def derive(preset: Preset) -> Derived:
    """The preset's figures (module docstring); ValueError when the weights leave no KV cache."""
    model, gpu, n = preset.model, preset.gpu, preset.num_gpus
    kv_bytes_per_token = model.kv_bytes_per_token // (
        model.kv_bytes_per_element if preset.fp8_kv_cache else 1)
    weights = weight_bytes(preset)
    activations = activation_peak_bytes(preset)
    kv_cache_bytes = n * (gpu.hbm_bytes * preset.gpu_memory_utilization - activations
                          - CUDA_GRAPH_BYTES) - weights
    num_gpu_blocks = int(max(kv_cache_bytes, 0.0) // (kv_bytes_per_token * preset.block_size))
    if num_gpu_blocks < 2:
        raise ValueError(f"preset {preset.name}: the weights leave no memory for the KV cache")
    bf16 = n * gpu.flops * preset.flops_efficiency
    dense = n * gpu.fp8_flops * preset.flops_efficiency if (
        preset.fp8_weights and gpu.fp8_flops) else bf16
    reductions = 2 * model.num_layers  # after the attention and after the MLP, every layer
    per_token = reductions * (allreduce_s(gpu, n, model.hidden * ACTIVATION_BYTES)
                              - allreduce_s(gpu, n, 0.0))
    return Derived(
        kv_bytes_per_token=kv_bytes_per_token,
        weight_bytes=weights,
        kv_cache_bytes=kv_cache_bytes,
        num_gpu_blocks=num_gpu_blocks,
        effective_bandwidth=n * gpu.bandwidth * preset.bandwidth_efficiency,
        effective_flops=dense,
        dense_flops_per_token=2.0 * model.num_params,
        # QK^T and AV: two multiply-adds per head dimension per query head per layer.
        attention_flops_per_pair=4.0 * model.num_layers * model.num_attention_heads
        * model.head_dim,
        step_overhead_s=preset.step_overhead_s,
        block_size=preset.block_size,
        attention_flops=bf16,
        activation_bytes=activations,
        cuda_graph_bytes=CUDA_GRAPH_BYTES,
        allreduce_fixed_s=reductions * allreduce_s(gpu, n, 0.0),
        allreduce_per_token_s=per_token,
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


# Datasheet figures: memory, HBM bandwidth, dense bf16 and FP8 FLOP/s without sparsity, and the
# GPU-to-GPU link (NVLink: half the datasheet's total, one direction; PCIe 4.0 x16: 32 GB/s).
_NVLINK_LATENCY_S = 4.5e-6  # per ring step of a small all-reduce (fitted, as above)
H100_SXM = GpuSpec("H100 SXM 80GB", hbm_bytes=80e9, bandwidth=3.35e12, flops=989e12,
                   fp8_flops=1979e12, link_bandwidth=450e9, link_latency_s=_NVLINK_LATENCY_S,
                   interconnect="NVLink 4")
H200_SXM = GpuSpec("H200 SXM 141GB", hbm_bytes=141e9, bandwidth=4.8e12, flops=989e12,
                   fp8_flops=1979e12, link_bandwidth=450e9, link_latency_s=_NVLINK_LATENCY_S,
                   interconnect="NVLink 4")
B200 = GpuSpec("B200 180GB", hbm_bytes=180e9, bandwidth=8.0e12, flops=2250e12, fp8_flops=4500e12,
               link_bandwidth=900e9, link_latency_s=_NVLINK_LATENCY_S, interconnect="NVLink 5")
A100_SXM = GpuSpec("A100 SXM 80GB", hbm_bytes=80e9, bandwidth=2.039e12, flops=312e12,
                   link_bandwidth=300e9, link_latency_s=_NVLINK_LATENCY_S,
                   interconnect="NVLink 3")
L40S = GpuSpec("L40S 48GB", hbm_bytes=48e9, bandwidth=864e9, flops=362e12, fp8_flops=733e12)
L4 = GpuSpec("L4 24GB", hbm_bytes=24e9, bandwidth=300e9, flops=121e12, fp8_flops=242e12)

# The models' published configurations (parameters, layers, heads, KV heads, head dimension,
# hidden and MLP sizes, vocabulary).
LLAMA_3_8B = ModelSpec("llama-3-8b", num_params=8.03e9, num_layers=32, num_attention_heads=32,
                       num_kv_heads=8, head_dim=128, hidden_size=4096, intermediate_size=14336)
LLAMA_3_70B = ModelSpec("llama-3-70b", num_params=70.6e9, num_layers=80, num_attention_heads=64,
                        num_kv_heads=8, head_dim=128, hidden_size=8192, intermediate_size=28672)
LLAMA_3_2_1B = ModelSpec("llama-3.2-1b", num_params=1.24e9, num_layers=16, num_attention_heads=32,
                         num_kv_heads=8, head_dim=64, max_model_len=32768, hidden_size=2048,
                         intermediate_size=8192)
# Llama 3.1: the same networks with a 128k-token context (for long-context traces).
LLAMA_3_1_8B = replace(LLAMA_3_8B, name="llama-3.1-8b", max_model_len=131072)
LLAMA_3_1_70B = replace(LLAMA_3_70B, name="llama-3.1-70b", max_model_len=131072)
QWEN_2_5_0_5B = ModelSpec("qwen2.5-0.5b", num_params=0.494e9, num_layers=24,
                          num_attention_heads=14, num_kv_heads=2, head_dim=64, max_model_len=32768,
                          hidden_size=896, intermediate_size=4864, vocab_size=151_936)

# The known ones by the names `kvgate plan --gpu` and `--model` take.
GPUS: Mapping[str, GpuSpec] = MappingProxyType({
    "h100": H100_SXM, "h200": H200_SXM, "b200": B200, "a100": A100_SXM, "l40s": L40S, "l4": L4})
MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {m.name: m for m in (LLAMA_3_8B, LLAMA_3_70B, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_2_1B,
                         QWEN_2_5_0_5B)})


def deployment_name(model: str, gpu: str, num_gpus: int = 1, fp8: bool = False) -> str:
    """A deployment's name, `MODEL-[Nx]GPU[-fp8]` with the `GPUS` key: what the simulator's
    presets call it (`loadtest.sim.presets.lookup`) and `kvgate plan` proposes."""
    return f"{model}-{f'{num_gpus}x' if num_gpus > 1 else ''}{gpu}{'-fp8' if fp8 else ''}"


# The deployment the gateway's speed model takes as its reference: an 8B model on one H100.
REFERENCE_PRESET = Preset("llama-3-8b-h100", LLAMA_3_8B, H100_SXM)


@dataclass(frozen=True, slots=True)
class ProfileFigures:
    """A backend's speed as the TTFT model sees it (`routing.ttft.BackendProfile`)."""

    prefill_tokens_per_s: float
    overhead_s: float  # per request: scheduling, detokenising, the first network hop
    decode_base_s: float  # one decode step reading no KV (the weights read once)
    decode_per_kv_token_s: float  # and per KV token the step's decodes read


# The reference preset's roofline rounded to two significant figures: the prefill speed of a
# 2k-token prompt, the empty decode step and the KV read per token of `derive(REFERENCE_PRESET)`.
# The per-request overhead is no step figure but calibrated: the time a request spends outside the
# engine's steps. Each backend's own speed is learned online relative to these.
REFERENCE_PROFILE = ProfileFigures(
    prefill_tokens_per_s=29_000.0,
    overhead_s=0.005,
    decode_base_s=0.0079,
    decode_per_kv_token_s=5.2e-8,
)
