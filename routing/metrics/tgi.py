"""Hugging Face TGI router metrics → one snapshot.

TGI exposes no KV metric. Its scheduler admits requests while the batch's token budget
(`--max-batch-total-tokens`, a launcher setting) holds their prompt plus max new tokens, and
`tgi_batch_current_max_tokens` is what the running batch has claimed of it. So with the budget
configured per backend, the budget is the capacity in tokens (block size 1) and
`budget - tgi_batch_current_max_tokens` the free part; without it every KV field is None.
Running is `tgi_batch_current_size`, waiting `tgi_queue_size`.
"""

from __future__ import annotations

from routing.metrics.prom import Groups, MetricsError, Samples, count, total
from routing.metrics.scan import SeriesReader
from routing.state import BackendSnapshot

QUEUE = "tgi_queue_size"
BATCH_SIZE = "tgi_batch_current_size"
BATCH_MAX_TOKENS = "tgi_batch_current_max_tokens"

NAMES = (BATCH_MAX_TOKENS, BATCH_SIZE, QUEUE)  # in the order TGI writes them

_READER = SeriesReader(NAMES)


def read(payload: bytes) -> Groups:
    return _READER.read(payload)


def build(
    samples: Samples, *, taken_at: float, max_batch_total_tokens: int | None
) -> BackendSnapshot:
    if QUEUE not in samples and BATCH_SIZE not in samples:
        raise MetricsError("no TGI load metrics (tgi_queue_size, tgi_batch_current_size)")
    claimed = total(samples.get(BATCH_MAX_TOKENS))
    budget = max_batch_total_tokens
    kv_total = kv_free = block_size = None
    usage = None
    if budget is not None and budget > 0 and claimed is not None:
        used = min(budget, max(0, round(claimed)))
        kv_total, kv_free, block_size, usage = budget, budget - used, 1, used / budget
    return BackendSnapshot(
        taken_at=taken_at,
        format="tgi",
        kv_total_blocks=kv_total,
        kv_free_blocks=kv_free,
        kv_usage=usage,
        block_size=block_size,
        running=count(samples.get(BATCH_SIZE)),
        waiting=count(samples.get(QUEUE)),
    )
