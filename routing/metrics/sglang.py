"""SGLang metrics → one snapshot.

SGLang's KV pool is token-granular, allocated in pages of `page_size` tokens:
- usage: `sglang:token_usage` (used tokens over `sglang:max_total_num_tokens`; cached prefixes
  that nothing references count as free, as they can be evicted for a new request);
- capacity: `sglang:max_total_num_tokens` tokens, `sglang:num_pages` pages of `sglang:page_size`
  tokens (v0.5.11 on); older versions carry `page_size` and `num_pages` only as labels of the info
  gauge `sglang:cache_config_info`, and tokens are then pages × page size;
- free pages: `(1 - usage) * tokens`, whole pages only;
- running `sglang:num_running_reqs`, waiting `sglang:num_queue_reqs`, preemptions
  `sglang:num_retracted_requests_total` (retractions are SGLang's preemptions), prefix-cache hit
  rate `sglang:cache_hit_rate`.
Each data-parallel rank (`dp_rank` label) has its own pool and queue: ranks are summed. The TP
ranks of one DP rank report the same figures, so one reading per DP rank is kept. With no page
size known anywhere, counts are in tokens (block size 1).
"""

from __future__ import annotations

from routing.metrics.prom import (
    Groups,
    MetricsError,
    Sample,
    Samples,
    count,
    finite,
    int_label,
    unit_fraction,
)
from routing.metrics.scan import SeriesReader
from routing.state import BackendSnapshot

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
MAX_TOKENS = "sglang:max_total_num_tokens"
PAGE_SIZE = "sglang:page_size"
NUM_PAGES = "sglang:num_pages"
CACHE_CONFIG = "sglang:cache_config_info"
HIT_RATE = "sglang:cache_hit_rate"
RETRACTIONS = "sglang:num_retracted_requests_total"

# In the order SGLang writes them: `NAMES` near the top, `TAIL` after the histograms (the reader
# searches those from the bottom up). The cache config info gauge of older versions is read only
# when a page gauge is missing.
NAMES = (RUNNING, WAITING, HIT_RATE, TOKEN_USAGE, RETRACTIONS)
TAIL = (MAX_TOKENS, PAGE_SIZE, NUM_PAGES)
_RENAMED = ((PAGE_SIZE, CACHE_CONFIG), (NUM_PAGES, CACHE_CONFIG))  # gauges, older: info labels
# Every sample name `read` may read, current and older: what the poller asks a server for when
# it filters (`/metrics?name[]=...`, routing/metrics/query.py).
SAMPLE_NAMES = tuple(dict.fromkeys((*NAMES, *TAIL, *(old for _, old in _RENAMED))))

READER = SeriesReader(NAMES, TAIL, _RENAMED)


def read(payload: bytes) -> Groups:
    """The series `build` reads: `NAMES`, and the older cache config info only where a page
    gauge is missing."""
    return READER.read(payload)


def build(samples: Samples, *, taken_at: float) -> BackendSnapshot:
    if TOKEN_USAGE not in samples and RUNNING not in samples:
        raise MetricsError("no SGLang load metrics (sglang:num_running_reqs, sglang:token_usage)")
    ranks = {name: per_dp_rank(samples.get(name)) for name in (*NAMES, *TAIL, CACHE_CONFIG)}
    total_blocks, free_blocks, usage, block_size = _kv(ranks)
    rates = [r for r in (finite(s.value) for s in ranks[HIT_RATE].values()) if r is not None]
    models = {s.labels.get("model_name", ""): None for s in samples.get(RUNNING) or ()}
    models.pop("", None)
    return BackendSnapshot(
        taken_at=taken_at,
        format="sglang",
        kv_total_blocks=total_blocks,
        kv_free_blocks=free_blocks,
        kv_usage=usage,
        block_size=block_size,
        running=count(list(ranks[RUNNING].values())),
        waiting=count(list(ranks[WAITING].values())),
        preemptions=count(list(ranks[RETRACTIONS].values())),
        prefix_cache_hit_rate=unit_fraction(sum(rates) / len(rates)) if rates else None,
        models=tuple(models) or None,
    )


def per_dp_rank(series: list[Sample] | None) -> dict[str, Sample]:
    """One sample per `dp_rank`: TP rank 0's, else the first."""
    out: dict[str, Sample] = {}
    for sample in series or ():
        key = sample.labels.get("dp_rank", "")
        kept = out.get(key)
        if kept is None or (sample.labels.get("tp_rank") == "0" != kept.labels.get("tp_rank")):
            out[key] = sample
    return out


def _kv(
    ranks: dict[str, dict[str, Sample]],
) -> tuple[int | None, int | None, float | None, int | None]:
    """(total blocks, free blocks, usage, block size) summed over DP ranks; a figure that any
    rank lacks is None rather than a partial sum."""
    usages = [(key, unit_fraction(s.value)) for key, s in ranks[TOKEN_USAGE].items()]
    known = [u for _, u in usages if u is not None]
    if not usages or len(known) < len(usages):
        return None, None, None, None
    mean_usage = sum(known) / len(known)
    pools: list[tuple[float, int, int, int | None]] = []  # usage, tokens, page, pages
    for key, usage in usages:
        assert usage is not None  # checked above; narrows for mypy
        config = ranks[CACHE_CONFIG].get(key)
        page = _gauge_int(ranks[PAGE_SIZE].get(key)) or _label(config, "page_size")
        pages = _gauge_int(ranks[NUM_PAGES].get(key)) or _label(config, "num_pages")
        tokens = _gauge_int(ranks[MAX_TOKENS].get(key))
        if tokens is None and page and pages:
            tokens = page * pages
        if tokens is None:
            return None, None, mean_usage, page
        # Without a known page size the pool is counted in tokens; a page count is then unusable.
        pools.append((usage, tokens, page, pages) if page else (usage, tokens, 1, None))
    if len({page for _, _, page, _ in pools}) != 1:  # no common block unit across ranks
        used = sum(u * t for u, t, _, _ in pools)
        return None, None, used / sum(t for _, t, _, _ in pools), None
    total_blocks = sum(pages or tokens // page for _, tokens, page, pages in pools)
    free_blocks = sum(round((1.0 - u) * tokens) // page for u, tokens, page, _ in pools)
    used_tokens = sum(u * tokens for u, tokens, _, _ in pools)
    return total_blocks, free_blocks, used_tokens / sum(t for _, t, _, _ in pools), pools[0][2]


def _label(config: Sample | None, label: str) -> int | None:
    return int_label(config, label) if config is not None else None


def _gauge_int(sample: Sample | None) -> int | None:
    if sample is None:
        return None
    value = finite(sample.value)
    return int(value) if value is not None and value > 0 else None
