"""llama.cpp `llama-server` metrics and `GET /slots` → one snapshot.

- /metrics: running `llamacpp:requests_processing`, waiting `llamacpp:requests_deferred`, prefix
  reuse `prompt_tokens_cached_total / (prompt_tokens_total + prompt_tokens_cached_total)` (the
  first counter excludes cached tokens). Older builds also export `llamacpp:kv_cache_usage_ratio`
  (used cells over the context size); current builds export no KV figure at all.
- /slots (JSON): the context is split between slots of `n_ctx` tokens each; a processing slot
  holds `n_past` tokens, an idle one's cells are free for the next request it takes. So the
  capacity is the sum of `n_ctx`, the used part the sum of `n_past` over processing slots, in
  tokens (block size 1). Older builds mark a busy slot with `state != 0` instead of
  `is_processing`. When a processing slot does not report `n_past`, usage falls back to the
  metrics' ratio, if any.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import orjson

from routing.metrics.prom import (
    Groups,
    MetricsError,
    Samples,
    count,
    total,
    unit_fraction,
)
from routing.metrics.scan import SeriesReader
from routing.state import BackendSnapshot

PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
KV_USAGE_RATIO = "llamacpp:kv_cache_usage_ratio"
PROMPT_TOKENS = "llamacpp:prompt_tokens_total"
PROMPT_TOKENS_CACHED = "llamacpp:prompt_tokens_cached_total"

# In the order llama-server writes them; the usage ratio only older builds write comes last.
NAMES = (PROMPT_TOKENS, PROMPT_TOKENS_CACHED, PROCESSING, DEFERRED, KV_USAGE_RATIO)

READER = SeriesReader(NAMES)


def read(payload: bytes) -> Groups:
    return READER.read(payload)


@dataclasses.dataclass(frozen=True, slots=True)
class Slots:
    """What `GET /slots` says about the KV cache, in tokens."""

    total_tokens: int
    used_tokens: int | None  # None when a processing slot does not report n_past
    processing: int


def build(samples: Samples, *, taken_at: float) -> BackendSnapshot:
    if PROCESSING not in samples and DEFERRED not in samples:
        raise MetricsError("no llama.cpp metrics (llamacpp:requests_processing)")
    processed = total(samples.get(PROMPT_TOKENS))
    cached = total(samples.get(PROMPT_TOKENS_CACHED))
    hit_rate = None
    if processed is not None and cached is not None and processed + cached > 0:
        hit_rate = unit_fraction(cached / (processed + cached))
    return BackendSnapshot(
        taken_at=taken_at,
        format="llamacpp",
        kv_usage=unit_fraction(total(samples.get(KV_USAGE_RATIO))),
        running=count(samples.get(PROCESSING)),
        waiting=count(samples.get(DEFERRED)),
        prefix_cache_hit_rate=hit_rate,
    )


def parse_slots(body: bytes | str, *, unified: bool = False) -> Slots:
    """The `GET /slots` JSON array; MetricsError when it is not one.

    The capacity is the slots' `n_ctx` summed: llama-server splits its context (`-c`) evenly
    between its slots. With `unified`, the slots share one KV cache (llama-server's default
    since late 2025 when `-np` is not given, or `-kvu`) and each reports the whole context as its
    `n_ctx`, so the capacity is the largest of them. /slots does not say which it is."""
    try:
        slots = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MetricsError(f"/slots is not JSON: {exc}") from exc
    if not isinstance(slots, list) or not slots:
        raise MetricsError("/slots is not a non-empty JSON array")
    total_tokens = processing = used = 0
    used_known = True
    for slot in slots:
        n_ctx = slot.get("n_ctx") if isinstance(slot, Mapping) else None
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx <= 0:
            raise MetricsError("a /slots entry has no positive integer n_ctx")
        total_tokens = max(total_tokens, n_ctx) if unified else total_tokens + n_ctx
        if not _is_processing(slot):
            continue
        processing += 1
        n_past = slot.get("n_past")
        if isinstance(n_past, int) and not isinstance(n_past, bool) and n_past >= 0:
            used += min(n_past, n_ctx)
        else:
            used_known = False
    return Slots(total_tokens, used if used_known else None, processing)


def with_slots(snapshot: BackendSnapshot, slots: Slots) -> BackendSnapshot:
    """The metrics snapshot completed with the slots' KV figures (and their running count when
    the metrics had none)."""
    capacity = slots.total_tokens
    if slots.used_tokens is not None:
        used = slots.used_tokens
    elif snapshot.kv_usage is not None:
        used = round(snapshot.kv_usage * capacity)
    else:
        return snapshot._replace(running=_first(snapshot.running, slots.processing))
    return snapshot._replace(
        kv_total_blocks=capacity,
        kv_free_blocks=capacity - used,
        kv_usage=used / capacity,
        block_size=1,
        running=_first(snapshot.running, slots.processing),
    )


def _is_processing(slot: Mapping[str, object]) -> bool:
    flag = slot.get("is_processing")
    if isinstance(flag, bool):
        return flag
    state = slot.get("state")
    return isinstance(state, int) and state != 0


def _first(value: int | None, fallback: int) -> int:
    return fallback if value is None else value
