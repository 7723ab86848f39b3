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
- Cost: the cache config and the LoRA adapters are read from their groups' bytes through a memo
  (a server writes the same ones at every scrape), so a busy server's scrape converts only the
  figures that move; one engine, the usual case, takes a short path through the KV arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache, partial
from types import MappingProxyType
from typing import NamedTuple

from routing.metrics.prom import (
    Groups,
    MetricsError,
    Sample,
    Samples,
    by_label,
    count,
    finite,
    int_label,
    parse_groups,
    total,
    unit_fraction,
)
from routing.metrics.scan import SeriesReader
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
# What seldom changes: the cache config (KV capacity), the LoRA adapters, and the success counter
# (read only to tell the simulator). `HOT_NAMES`, what the poller asks for between its scrapes of
# every name (routing/metrics/query.py, routing/poller.py), are the load gauges routing reads at
# every decision; the cumulative counters (preemptions, prefix cache queries and hits) move too,
# but their rates need no fresher reading than the full scrape's, about once a second, and
# leaving them out halves the hot answer.
SLOW = (CACHE_CONFIG, LORA_INFO, SUCCESS)
_COUNTERS = (PREEMPTIONS, *PREFIX_QUERIES, *PREFIX_HITS, PREFIX_HIT_RATE_V0)
HOT_NAMES = tuple(name for name in SAMPLE_NAMES if name not in SLOW and name not in _COUNTERS)
_SIM_CACHE_LABELS = frozenset({"block_size", "num_gpu_blocks"})
_PREFIX_NAMES = tuple(zip(PREFIX_QUERIES, PREFIX_HITS, strict=True))
# The groups `build` reads as samples; the slow ones it reads from their bytes, through memos,
# and `snapshot_of` need not parse them.
PARSED = frozenset(SAMPLE_NAMES) - frozenset(SLOW)

READER = SeriesReader(NAMES, TAIL, _RENAMED)


def read(payload: bytes) -> Groups:
    """The series `build` reads: `NAMES` and `TAIL`, and the older names only where current ones
    are missing."""
    return READER.read(payload)


def build(
    samples: Samples, *, taken_at: float, variant: str | None, groups: Groups
) -> BackendSnapshot:
    """`variant` is "vllm" (V1) or "vllm-v0" as configured, or None to tell from the payload.
    `groups` are the groups read, `samples` those of `PARSED` parsed (or more): what seldom
    changes (the cache config, the LoRA adapters, whether the success counter says simulator)
    is read from the groups through memos, so a busy server's scrape converts only the figures
    that move."""
    get = samples.get
    usage_series = get(KV_USAGE) or get(KV_USAGE_OLD)
    running, waiting = get(RUNNING), get(WAITING)
    if not usage_series and running is None and waiting is None:
        raise MetricsError("no vLLM load metrics (vllm:num_requests_running, KV usage)")
    config, simulator = _config_of(groups)
    if variant is None:
        has_engines = False
        for sample in usage_series or running or ():
            if "engine" in sample.labels:
                has_engines = True
                break
        variant = "vllm" if KV_USAGE in samples or has_engines or simulator else "vllm-v0"
    reserved = _reserved(variant, simulator)
    total_blocks, free_blocks, usage = kv_figures(usage_series, config, reserved)
    return BackendSnapshot(
        taken_at=taken_at,
        format=variant,
        kv_total_blocks=total_blocks,
        kv_free_blocks=free_blocks,
        kv_usage=usage,
        block_size=config.block_size,
        running=count(running),
        waiting=count(waiting),
        preemptions=count(get(PREEMPTIONS)),
        prefix_cache_hit_rate=_hit_rate(samples),
        models=_models((running, waiting, usage_series), _adapters_of(groups.get(LORA_INFO))),
    )


def rebuild(
    snapshot: BackendSnapshot, load: Samples, groups: Groups, *, taken_at: float
) -> BackendSnapshot:
    """What `build` gives, taken at `taken_at`, for samples that differ from those it built
    `snapshot` from only in the values of the load series: `load` holds the samples of every
    load series (running, waiting, KV usage) that those had, with the same labels, and
    `groups` are the same groups. `build` reads those values in three figures only (the
    running and waiting counts, and the KV figures through `kv_figures`); every other field
    depends on names, labels and the other groups alone, and is `snapshot`'s. The poller's hot
    answers (routing/metrics/template.py)."""
    get = load.get
    config, simulator = _config_of(groups)
    variant = snapshot.format
    total_blocks, free_blocks, usage = kv_figures(
        get(KV_USAGE) or get(KV_USAGE_OLD), config, _reserved(variant, simulator))
    return _new_snapshot((
        taken_at, variant, total_blocks, free_blocks, usage, snapshot.block_size,
        count(get(RUNNING)), count(get(WAITING)), *snapshot[_AFTER_LOAD:],
    ))


# `rebuild` makes a snapshot from its fields in order: the load figures, then the others.
_new_snapshot = partial(tuple.__new__, BackendSnapshot)
_AFTER_LOAD = BackendSnapshot._fields.index("preemptions")
assert BackendSnapshot._fields[:_AFTER_LOAD] == (
    "taken_at", "format", "kv_total_blocks", "kv_free_blocks", "kv_usage", "block_size",
    "running", "waiting",
)


def _config_of(groups: Groups) -> tuple[CacheConfig, bool]:
    """The cache config, and whether the server is llm-d-inference-sim."""
    config = cache_config_of(groups.get(CACHE_CONFIG))
    return config, config.simulator or _success_says_simulator(groups.get(SUCCESS))


def _reserved(variant: str, simulator: bool) -> int:
    """Blocks kept out of the pool: V1's null block (not the simulator's, not V0's)."""
    return 1 if variant == "vllm" and not simulator else 0


def is_simulator(groups: Groups) -> bool:
    """llm-d-inference-sim: a `finish_reason` label on its success counter, or a cache config
    with only `block_size` and `num_gpu_blocks`."""
    return (_success_says_simulator(groups.get(SUCCESS))
            or cache_config_of(groups.get(CACHE_CONFIG)).simulator)


def _success_says_simulator(group: bytes | None) -> bool:
    # A group without the label's name anywhere has no sample that carries it: no parse.
    return group is not None and b"finish_reason" in group and _finish_reason_label(group)


@lru_cache(maxsize=256)
def _finish_reason_label(group: bytes) -> bool:
    for sample in parse_groups({SUCCESS: group}).get(SUCCESS) or ():
        if "finish_reason" in sample.labels:
            return True
    return False


class CacheConfig(NamedTuple):
    """What `vllm:cache_config_info` says."""

    blocks: Mapping[str, int | None]  # engine label ("" when absent) -> num_gpu_blocks
    block_size: int | None
    simulator: bool  # labels block_size and num_gpu_blocks only: llm-d-inference-sim


def cache_config(series: list[Sample] | None) -> CacheConfig:
    configs = by_label(series, "engine")
    sizes = (int_label(s, "block_size") for s in configs.values())
    return CacheConfig(
        MappingProxyType({key: int_label(s, "num_gpu_blocks") for key, s in configs.items()}),
        next((size for size in sizes if size), None),
        bool(series) and all(s.labels.keys() == _SIM_CACHE_LABELS for s in series or ()),
    )


@lru_cache(maxsize=256)
def cache_config_of(group: bytes | None) -> CacheConfig:
    """`cache_config` of a group's samples, by the group's bytes: a server writes the same
    group at every scrape. Shared, hence read-only."""
    return cache_config(parse_groups({CACHE_CONFIG: group}).get(CACHE_CONFIG) if group else None)


def kv_figures(
    usage_series: list[Sample] | None, config: CacheConfig, reserved: int
) -> tuple[int | None, int | None, float | None]:
    """(total blocks, free blocks, usage) summed over engines; a figure that any engine lacks is
    None rather than a partial sum."""
    blocks = config.blocks
    if usage_series is not None and len(usage_series) == 1 and len(blocks) == 1:
        # The usual case, one engine: the general computation below, in fewer steps.
        value = usage_series[0].value
        if not math.isfinite(value):
            return None, None, None
        fraction = min(1.0, max(0.0, value))
        key = usage_series[0].labels.get("engine", "")
        n = blocks[key] if key in blocks else next(iter(blocks.values()))
        if n is None or n <= reserved:
            return None, None, fraction
        pool = n - reserved
        return n, round((1.0 - fraction) * pool), fraction * pool / pool
    return kv_figures_any(usage_series, blocks, reserved)


def kv_figures_any(
    usage_series: list[Sample] | None, blocks: Mapping[str, int | None], reserved: int
) -> tuple[int | None, int | None, float | None]:
    """`kv_figures` for any number of engines and configs."""
    if usage_series is not None and len(usage_series) == 1:
        sample = usage_series[0]
        usages = {sample.labels.get("engine", ""): unit_fraction(sample.value)}
    else:
        engines = by_label(usage_series, "engine")
        usages = {key: unit_fraction(s.value) for key, s in engines.items()}
    if not usages or any(u is None for u in usages.values()):
        return None, None, None
    # A lone config without an engine label (older V1, the simulator) belongs to a lone engine.
    lone = next(iter(blocks.values())) if len(blocks) == 1 and len(usages) == 1 else None
    capacity = {key: blocks[key] if key in blocks else lone for key in usages}
    if any(n is None or n <= reserved for n in capacity.values()):
        mean = math.fsum(u for u in usages.values() if u is not None) / len(usages)
        return None, None, mean
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
    return total_blocks, free_blocks, used_weighted / pool_total


def _hit_rate(samples: Samples) -> float | None:
    """V1: lifetime prefix-cache hits over queries (tokens), current names first; V0: its gauge
    (negative means prefix caching is off)."""
    for queries_name, hits_name in _PREFIX_NAMES:
        queries = total(samples.get(queries_name))
        if queries is not None:
            hits = total(samples.get(hits_name))
            return None if hits is None or queries <= 0 else min(1.0, hits / queries)
    gauges = (finite(s.value) for s in samples.get(PREFIX_HIT_RATE_V0) or ())
    rates = [r for r in gauges if r is not None and r >= 0]
    return min(1.0, sum(rates) / len(rates)) if rates else None


def _models(
    load: tuple[list[Sample] | None, ...], adapters: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The served model names (`model_name` labels of the load and usage series) and the LoRA
    `adapters`."""
    names: dict[str, None] = {}
    for series in load:
        for sample in series or ():
            model = sample.labels.get("model_name")
            if model:
                names[model] = None
    names.update(dict.fromkeys(adapters))
    return tuple(names) or None


@lru_cache(maxsize=256)
def _adapters_of(group: bytes | None) -> tuple[str, ...]:
    """The LoRA adapters, running and waiting, in the newest `vllm:lora_requests_info` sample
    (its value is the time it was set), by the group's bytes (see `cache_config_of`)."""
    series = parse_groups({LORA_INFO: group}).get(LORA_INFO) if group else None
    lora = [s for s in series or () if math.isfinite(s.value)]
    if not lora:
        return ()
    newest = max(lora, key=lambda s: s.value)
    names: dict[str, None] = {}
    for label in ("running_lora_adapters", "waiting_lora_adapters"):
        for adapter in newest.labels.get(label, "").split(","):
            if adapter.strip():
                names[adapter.strip()] = None
    return tuple(names)
