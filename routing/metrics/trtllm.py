"""TensorRT-LLM on Triton (the tensorrtllm_backend's `nv_trt_llm_*` metrics) → one snapshot.

- `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=...}`: "max" (the pool, in blocks),
  "free", "used", "tokens_per" (block size), "fraction" (used / max);
- `nv_trt_llm_request_metrics{request_type=...}`: "scheduled" requests are running, "waiting" ones
  queued (older backends have no "waiting": None).
Series are grouped by their other labels (`model`, `version`): several TRT-LLM models in one
Triton server each have a pool, and the pools are summed. The `model` label names a Triton model
(e.g. "tensorrt_llm"), not the name clients request, so no models are reported.
"""

from __future__ import annotations

from routing.metrics.prom import (
    Groups,
    MetricsError,
    Sample,
    Samples,
    finite,
    unit_fraction,
)
from routing.metrics.scan import SeriesReader
from routing.state import BackendSnapshot

KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
REQUESTS = "nv_trt_llm_request_metrics"

NAMES = (REQUESTS, KV_BLOCKS)  # in the order Triton writes them

READER = SeriesReader(NAMES)


def read(payload: bytes) -> Groups:
    return READER.read(payload)


def build(samples: Samples, *, taken_at: float) -> BackendSnapshot:
    if KV_BLOCKS not in samples and REQUESTS not in samples:
        raise MetricsError(f"no TensorRT-LLM metrics ({KV_BLOCKS}, {REQUESTS})")
    pools = _grouped(samples.get(KV_BLOCKS), "kv_cache_block_type")
    requests = _grouped(samples.get(REQUESTS), "request_type")
    kv_total = _sum(pools, "max")
    kv_free = _sum(pools, "free")
    used = _sum(pools, "used")
    usage: float | None = None
    if len(pools) == 1 and "fraction" in pools[0]:
        usage = unit_fraction(pools[0]["fraction"])
    if usage is None and kv_total and used is not None:
        usage = unit_fraction(used / kv_total)
    block_sizes = {int(p["tokens_per"]) for p in pools if p.get("tokens_per", 0) > 0}
    running = _sum(requests, "scheduled")
    waiting = _sum(requests, "waiting")
    return BackendSnapshot(
        taken_at=taken_at,
        format="trtllm",
        kv_total_blocks=None if kv_total is None else int(kv_total),
        kv_free_blocks=None if kv_free is None else int(kv_free),
        kv_usage=usage,
        block_size=block_sizes.pop() if len(block_sizes) == 1 else None,
        running=None if running is None else int(running),
        waiting=None if waiting is None else int(waiting),
    )


def _grouped(series: list[Sample] | None, kind_label: str) -> list[dict[str, float]]:
    """{kind: value} per group of series that share every label but `kind_label`."""
    groups: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for sample in series or ():
        kind = sample.labels.get(kind_label)
        value = finite(sample.value)
        if kind is None or value is None:
            continue
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != kind_label))
        groups.setdefault(key, {})[kind] = value
    return list(groups.values())


def _sum(groups: list[dict[str, float]], kind: str) -> float | None:
    """The sum over groups, None unless every group reports `kind`."""
    if not groups or any(kind not in g for g in groups):
        return None
    return max(0.0, sum(g[kind] for g in groups))
