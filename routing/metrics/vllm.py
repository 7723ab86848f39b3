"""vLLM (V1 and V0 engines) and llm-d-inference-sim metrics → one snapshot.

- KV usage: `vllm:kv_cache_usage_perc` (current), falling back to `vllm:gpu_cache_usage_perc`
  (V0, and V1 before the rename), so an upgrade that drops the old name does not blind routing.
- Capacity: `num_gpu_blocks` and `block_size` are labels of the info gauge
  `vllm:cache_config_info`.
- Free blocks: V1 keeps one null block out of its pool and reports
  `usage = 1 - free / (num_gpu_blocks - 1)`, so `free = (1 - usage) * (num_gpu_blocks - 1)`; V0
  and llm-d-inference-sim have no reserved block: `free = (1 - usage) * num_gpu_blocks`.
- Data parallelism: a V1 server with several engines exposes one series per `engine` label; each
  engine's free blocks are computed on its own and then summed.
- Variant: a payload with the current usage name or `engine` labels is V1 ("vllm"), else V0
  ("vllm-v0"). llm-d-inference-sim speaks vLLM's names but reports `finish_reason` where vLLM says
  `finished_reason`, and its `vllm:cache_config_info` carries only `block_size` and
  `num_gpu_blocks`; either sign marks it (format "vllm", no reserved block).
"""

from __future__ import annotations

import math

from routing.metrics.prom import (
    Groups,
    MetricsError,
    Sample,
    Samples,
    by_label,
    count,
    finite,
    int_label,
    read_groups,
    read_older,
    total,
    unit_fraction,
)
from routing.state import BackendSnapshot

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_HIT_RATE_V0 = "vllm:gpu_prefix_cache_hit_rate"
LORA_INFO = "vllm:lora_requests_info"
SUCCESS = "vllm:request_success_total"

# The series current servers write, in the order vLLM writes them: `NAMES` in the first few KB,
# `TAIL` at the very end, after the histograms (the reader searches those from the bottom up).
# The older names are read only when the current ones are missing.
NAMES = (RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES[0], PREFIX_HITS[0], PREEMPTIONS, SUCCESS)
TAIL = (LORA_INFO, CACHE_CONFIG)
# (current name, what older servers write instead)
_RENAMED = (
    (KV_USAGE, KV_USAGE_OLD),
    (PREFIX_QUERIES[0], PREFIX_QUERIES[1]),
    (PREFIX_HITS[0], PREFIX_HITS[1]),
    (PREFIX_QUERIES[0], PREFIX_HIT_RATE_V0),
)
# Every sample name `read` may read, current and older: what the poller asks a server for when
# it filters (`/metrics?name[]=...`, routing/metrics/query.py).
SAMPLE_NAMES = tuple(dict.fromkeys((*NAMES, *TAIL, *(old for _, old in _RENAMED))))
_SIM_CACHE_LABELS = frozenset({"block_size", "num_gpu_blocks"})


def read(payload: bytes) -> Groups:
    """The series `build` reads: `NAMES` and `TAIL`, and the older names only where current ones
    are missing."""
    return read_older(payload, read_groups(payload, NAMES, TAIL), _RENAMED)


def build(samples: Samples, *, taken_at: float, variant: str | None) -> BackendSnapshot:
    """`variant` is "vllm" (V1) or "vllm-v0" as configured, or None to tell from the payload."""
    usage_series = samples.get(KV_USAGE) or samples.get(KV_USAGE_OLD)
    if not usage_series and RUNNING not in samples and WAITING not in samples:
        raise MetricsError("no vLLM load metrics (vllm:num_requests_running, KV usage)")
    simulator = is_simulator(samples)
    if variant is None:
        has_engines = any("engine" in s.labels for s in usage_series or samples.get(RUNNING) or ())
        variant = "vllm" if KV_USAGE in samples or has_engines or simulator else "vllm-v0"
    reserved = 1 if variant == "vllm" and not simulator else 0
    total_blocks, free_blocks, usage, block_size = _kv(usage_series, samples, reserved)
    return BackendSnapshot(
        taken_at=taken_at,
        format=variant,
        kv_total_blocks=total_blocks,
        kv_free_blocks=free_blocks,
        kv_usage=usage,
        block_size=block_size,
        running=count(samples.get(RUNNING)),
        waiting=count(samples.get(WAITING)),
        preemptions=count(samples.get(PREEMPTIONS)),
        prefix_cache_hit_rate=_hit_rate(samples),
        models=_models(samples, usage_series),
    )


def is_simulator(samples: Samples) -> bool:
    if any("finish_reason" in s.labels for s in samples.get(SUCCESS) or ()):
        return True
    configs = samples.get(CACHE_CONFIG) or ()
    return bool(configs) and all(s.labels.keys() == _SIM_CACHE_LABELS for s in configs)


def _kv(
    usage_series: list[Sample] | None, samples: Samples, reserved: int
) -> tuple[int | None, int | None, float | None, int | None]:
    """(total blocks, free blocks, usage, block size) summed over engines; a figure that any
    engine lacks is None rather than a partial sum."""
    configs = by_label(samples.get(CACHE_CONFIG), "engine")
    sizes = (int_label(s, "block_size") for s in configs.values())
    block_size = next((size for size in sizes if size), None)
    usages = {key: unit_fraction(s.value) for key, s in by_label(usage_series, "engine").items()}
    if not usages or any(u is None for u in usages.values()):
        return None, None, None, block_size
    # A lone config without an engine label (older V1, the simulator) belongs to a lone engine.
    lone = next(iter(configs.values())) if len(configs) == 1 and len(usages) == 1 else None
    capacity: dict[str, int | None] = {}
    for key in usages:
        config = configs.get(key, lone)
        capacity[key] = int_label(config, "num_gpu_blocks") if config is not None else None
    if any(n is None or n <= reserved for n in capacity.values()):
        mean = math.fsum(u for u in usages.values() if u is not None) / len(usages)
        return None, None, mean, block_size
    total_blocks = free_blocks = 0
    used_weighted = 0.0
    for key, usage in usages.items():
        n = capacity[key]
        assert usage is not None and n is not None  # checked above; narrows for mypy
        pool = n - reserved
        total_blocks += n
        free_blocks += round((1.0 - usage) * pool)
        used_weighted += usage * pool
    pool_total = total_blocks - reserved * len(usages)
    return total_blocks, free_blocks, used_weighted / pool_total, block_size


def _hit_rate(samples: Samples) -> float | None:
    """V1: lifetime prefix-cache hits over queries (tokens), current names first; V0: its gauge
    (negative means prefix caching is off)."""
    for queries_name, hits_name in zip(PREFIX_QUERIES, PREFIX_HITS, strict=True):
        queries = total(samples.get(queries_name))
        if queries is not None:
            hits = total(samples.get(hits_name))
            return None if hits is None or queries <= 0 else min(1.0, hits / queries)
    gauges = (finite(s.value) for s in samples.get(PREFIX_HIT_RATE_V0) or ())
    rates = [r for r in gauges if r is not None and r >= 0]
    return min(1.0, sum(rates) / len(rates)) if rates else None


def _models(samples: Samples, usage_series: list[Sample] | None) -> tuple[str, ...] | None:
    """The served model names (`model_name` labels of the load and usage series) and the LoRA
    adapters in the newest `vllm:lora_requests_info` series (its value is the time it was set)."""
    names: dict[str, None] = {}
    for series in (samples.get(RUNNING), samples.get(WAITING), usage_series):
        for sample in series or ():
            model = sample.labels.get("model_name")
            if model:
                names[model] = None
    lora = [s for s in samples.get(LORA_INFO) or () if math.isfinite(s.value)]
    if lora:
        newest = max(lora, key=lambda s: s.value)
        for label in ("running_lora_adapters", "waiting_lora_adapters"):
            for adapter in newest.labels.get(label, "").split(","):
                if adapter.strip():
                    names[adapter.strip()] = None
    return tuple(names) or None
