"""Capacity planning: what one replica of a model on some GPUs sustains, and how many it takes.

Pure: `plan(...)` takes specs and a request shape and returns a frozen `Plan`. The physics is
`routing.physics` (a `Preset` and `derive(preset)`, the simulator's own), never restated here.

Steady state of a saturated replica running B sequences of `prompt` + `output` tokens:

    s(B) = decode_step_s(B, B * (prompt + output / 2))   # a decode step at the average context
    D    = B / s(B)                                      # output tokens/s while decoding
    p(B) = sum over the prompt's chunks of step_time(chunk, B decodes) - s(B)
                                                         # what a prefill adds to the steps it
                                                         # rides in (they share one weight read)
    f    = r * p(B)                                      # the GPU's time spent prefilling
    r    = (1 - f) * D / output                          # requests/s the decodes complete
         = (D / output) / (1 + (D / output) * p(B))
    TPOT = s(B) / (1 - f)                                # prefills stall every decode step

with chunks of at most `max_num_batched_tokens`, as the engine schedules them, and the step times
of the deployment (tensor parallel over `gpus_per_replica` GPUs, with FP8 weights and KV cache
when `fp8`). The saturated capacity is the best r over B in 1..min(max_num_seqs, sequences whose
KV fits); the SLO capacity the best r whose TPOT meets the TPOT SLO. Queueing under bursty
arrivals is not modelled: `kvgate simulate` checks a plan, and the tests hold the saturated
capacity close to that of one saturated simulated engine fed the same requests. Preemption is not
modelled either: where few requests fit the KV cache, the engine overcommits it and preempts, and
departs from the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routing.physics import (
    Derived,
    GpuSpec,
    ModelSpec,
    Preset,
    attention_pairs,
    derive,
    weight_bytes,
)


@dataclass(frozen=True, slots=True)
class Operating:
    """One steady state of a saturated replica: `concurrency` sequences in flight."""

    concurrency: int
    requests_per_s: float
    output_tokens_per_s: float
    tpot_s: float
    prefill_fraction: float  # of the GPU's time


@dataclass(frozen=True, slots=True)
class Fleet:
    """Replicas for `rate` requests/s, each kept within the TPOT SLO."""

    rate: float
    replicas: int
    gpus: int
    requests_per_s_per_replica: float
    load: float  # each replica's share of the rate over its SLO capacity, in (0, 1]


@dataclass(frozen=True, slots=True)
class Plan:
    model: ModelSpec
    gpu: GpuSpec
    gpus_per_replica: int
    prompt_tokens: int
    output_tokens: int
    memory_utilization: float
    max_num_seqs: int
    tpot_slo_s: float | None
    ttft_slo_s: float | None
    weights_bytes: float  # per replica
    kv_cache_bytes: float
    kv_bytes_per_token: int
    kv_tokens_capacity: int
    sequences_that_fit: int  # of prompt + output tokens, in whole KV blocks
    single_stream_tokens_per_s: float  # batch 1 at the request's average context
    bandwidth_ceiling_tokens_per_s: float  # datasheet bandwidth / weight bytes
    prefill_tokens_per_s: float  # for one prompt on an idle replica
    idle_ttft_s: float
    saturated: Operating
    slo: Operating | None  # None: even batch 1 misses the TPOT SLO
    fleet: Fleet | None  # None without a rate, or when no batch meets the TPOT SLO
    warnings: tuple[str, ...]
    fp8: bool = False  # FP8 weights and KV cache

    @property
    def slo_requests_per_s(self) -> float:
        return self.slo.requests_per_s if self.slo is not None else 0.0


def plan(model: ModelSpec, gpu: GpuSpec, *, gpus_per_replica: int = 1, prompt_tokens: int,
         output_tokens: int, rate: float | None, tpot_slo_s: float | None,
         ttft_slo_s: float | None, memory_utilization: float = 0.9, max_num_seqs: int = 256,
         max_num_batched_tokens: int = 8192, fp8: bool = False,
         longest_tokens: int | None = None) -> Plan:
    """The plan for requests of `prompt_tokens` + `output_tokens` (module docstring), with FP8
    weights and KV cache when `fp8`; ValueError naming the problem for a bad argument, or
    weights or a request (of `longest_tokens`, by default prompt + output) that do not fit."""
    _check(gpus_per_replica=gpus_per_replica, prompt_tokens=prompt_tokens,
           output_tokens=output_tokens, max_num_seqs=max_num_seqs,
           max_num_batched_tokens=max_num_batched_tokens)
    _check_positive(rate=rate, tpot_slo_s=tpot_slo_s, ttft_slo_s=ttft_slo_s)
    if not 0.0 < memory_utilization <= 1.0:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization:g}")
    preset = Preset(f"{model.name}-{gpus_per_replica}x{gpu.name}", model, gpu,
                    num_gpus=gpus_per_replica, gpu_memory_utilization=memory_utilization,
                    max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                    fp8_weights=fp8, fp8_kv_cache=fp8)
    d = _derive(preset)
    seq_tokens = prompt_tokens + output_tokens
    fit = d.sequences_that_fit(seq_tokens)
    longest = max(seq_tokens, longest_tokens or 0)
    if d.sequences_that_fit(longest) < 1:
        raise ValueError(
            f"one request of {longest} tokens needs more KV than the replica's cache holds "
            f"({d.kv_tokens_capacity()} tokens); use more GPUs per replica or shorter requests")

    idle_ttft = _prefill_s(d, prompt_tokens, max_num_batched_tokens)
    prefill_tps = prompt_tokens / idle_ttft
    points = [_operating(d, b, prompt_tokens, output_tokens, max_num_batched_tokens)
              for b in range(1, min(max_num_seqs, fit) + 1)]
    saturated = max(points, key=lambda p: p.requests_per_s)
    within = [p for p in points if tpot_slo_s is None or p.tpot_s <= tpot_slo_s]
    slo = max(within, key=lambda p: p.requests_per_s) if within else None
    fleet = None
    if rate is not None and slo is not None:
        replicas = math.ceil(rate / slo.requests_per_s)
        fleet = Fleet(rate, replicas, replicas * gpus_per_replica, rate / replicas,
                      rate / (replicas * slo.requests_per_s))

    warnings: list[str] = []
    if ttft_slo_s is not None and idle_ttft > ttft_slo_s:
        warnings.append(f"idle TTFT {idle_ttft * 1e3:.0f} ms is over the TTFT SLO "
                        f"{ttft_slo_s * 1e3:g} ms: even an idle replica misses it")
    if slo is None:
        assert tpot_slo_s is not None  # without an SLO every batch is within it
        warnings.append(f"even batch 1 takes {points[0].tpot_s * 1e3:.1f} ms per output token, "
                        f"over the TPOT SLO {tpot_slo_s * 1e3:g} ms: SLO capacity 0"
                        + (", no fleet size" if rate is not None else ""))
    if seq_tokens > model.max_model_len:
        warnings.append(f"prompt + output ({seq_tokens} tokens) exceeds {model.name}'s "
                        f"max_model_len {model.max_model_len}: such requests are refused")

    return Plan(
        model=model, gpu=gpu, gpus_per_replica=gpus_per_replica, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, memory_utilization=memory_utilization,
        max_num_seqs=max_num_seqs, tpot_slo_s=tpot_slo_s, ttft_slo_s=ttft_slo_s,
        weights_bytes=d.weight_bytes, kv_cache_bytes=d.kv_cache_bytes,
        kv_bytes_per_token=d.kv_bytes_per_token, kv_tokens_capacity=d.kv_tokens_capacity(),
        sequences_that_fit=fit,
        single_stream_tokens_per_s=1.0 / d.decode_step_s(1, _avg_ctx(1, prompt_tokens,
                                                                     output_tokens)),
        bandwidth_ceiling_tokens_per_s=gpus_per_replica * gpu.bandwidth / d.weight_bytes,
        prefill_tokens_per_s=prefill_tps, idle_ttft_s=idle_ttft, saturated=saturated, slo=slo,
        fleet=fleet, warnings=tuple(warnings), fp8=fp8)


def _derive(preset: Preset) -> Derived:
    model, gpu = preset.model, preset.gpu
    weights = weight_bytes(preset)
    memory = preset.num_gpus * gpu.hbm_bytes * preset.gpu_memory_utilization
    where = (f"{preset.num_gpus} x {gpu.name} at memory utilization "
             f"{preset.gpu_memory_utilization:g} ({memory / 1e9:.1f} GB)")
    if weights >= memory:
        raise ValueError(f"{model.name}'s weights ({weights / 1e9:.1f} GB) do not fit {where}; "
                         "use more GPUs per replica")
    try:
        return derive(preset)
    except ValueError as exc:
        raise ValueError(f"{model.name}'s weights ({weights / 1e9:.1f} GB) leave no room for "
                         f"the KV cache on {where}; use more GPUs per replica") from exc


def _avg_ctx(batch: int, prompt: int, output: int) -> int:
    """KV tokens `batch` decodes read at the average context, prompt + output / 2 each."""
    return batch * (2 * prompt + output) // 2


def _prefill_s(d: Derived, tokens: int, chunk: int) -> float:
    """Seconds to prefill one prompt alone, in chunks of at most `chunk` tokens (one a step)."""
    total, done = 0.0, 0
    while done < tokens:
        c = min(chunk, tokens - done)
        total += d.step_time(c, attention_pairs(done, c), 0, 0)
        done += c
    return total


def _operating(d: Derived, batch: int, prompt: int, output: int, chunk: int) -> Operating:
    ctx = _avg_ctx(batch, prompt, output)
    step = d.decode_step_s(batch, ctx)
    # A prompt's cost: what its chunks add to the decode steps they ride in (one weight read).
    cost, done = 0.0, 0
    while done < prompt:
        c = min(chunk, prompt - done)
        cost += d.step_time(c, attention_pairs(done, c), batch, ctx) - step
        done += c
    per_output = batch / step / output  # requests/s if decoding had the GPU to itself
    rate = per_output / (1.0 + per_output * cost)
    f = rate * cost
    return Operating(batch, rate, rate * output, step / (1.0 - f), f)


def _check(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be a finite number > 0, got {value:g}")
