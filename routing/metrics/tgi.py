"""Hugging Face TGI router metrics → one snapshot.

TGI exposes no KV metric. Its scheduler admits requests while the batch's token budget
(`--max-batch-total-tokens`, a launcher setting) holds their prompt plus max new tokens, and
`tgi_batch_current_max_tokens` is what the running batch has claimed of it. So with the budget
configured per backend, the budget is the capacity in tokens (block size 1) and
`budget - tgi_batch_current_max_tokens` the free part; without it every KV field is None.
Running is `tgi_batch_current_size`, waiting `tgi_queue_size`.

TGI's router sets its queue gauge when the first request is queued, and its batch gauges when
the first batch runs (its batching task, backends/v3): until then its /metrics has none of them.
With the format configured as TGI, such a payload is a router that has not batched yet, so idle
(`check_unbatched` first rules out another server's payload and what is not metrics at all),
rather than a failed scrape: a backend that fails its scrapes is never routed to, and this one
would then never see the request that makes the gauges appear. A detected format cannot tell an
un-batched TGI from anything else: configure `metrics_format: tgi` for TGI backends.
"""

from __future__ import annotations

from routing.metrics.detect import detect_family
from routing.metrics.prom import Groups, MetricsError, Samples, count, total
from routing.metrics.scan import SeriesReader
from routing.state import BackendSnapshot

QUEUE = "tgi_queue_size"
BATCH_SIZE = "tgi_batch_current_size"
BATCH_MAX_TOKENS = "tgi_batch_current_max_tokens"

NAMES = (BATCH_MAX_TOKENS, BATCH_SIZE, QUEUE)  # in the order TGI writes them

READER = SeriesReader(NAMES)


def read(payload: bytes) -> Groups:
    return READER.read(payload)


def has_load(groups: Groups) -> bool:
    return QUEUE in groups or BATCH_SIZE in groups


def check_unbatched(payload: bytes) -> None:
    """Raises MetricsError unless `payload`, configured as TGI's and without its load gauges, is
    what a TGI router that has not batched yet writes: nothing, or only `tgi_` series (module
    docstring). Another server's metrics, an HTML page or any other text is an error."""
    try:
        family = detect_family(payload)
    except MetricsError:
        family = None
    if family is not None:
        raise MetricsError(f"configured as TGI, but the payload is {family}'s metrics")
    for line in payload.splitlines():
        line = line.strip()
        if line and not line.startswith((b"#", b"tgi_")):
            raise MetricsError("no TGI load metrics (tgi_queue_size, tgi_batch_current_size), "
                               "and not a TGI router's payload")


def build(
    samples: Samples, *, taken_at: float, max_batch_total_tokens: int | None
) -> BackendSnapshot:
    """A snapshot; a missing gauge reads 0 (a router that has not queued or batched yet, see
    `check_unbatched`, which `routing.metrics.read_metrics` applies first)."""
    claimed = total(samples[BATCH_MAX_TOKENS]) if BATCH_MAX_TOKENS in samples else 0.0
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
        running=count(samples[BATCH_SIZE]) if BATCH_SIZE in samples else 0,
        waiting=count(samples[QUEUE]) if QUEUE in samples else 0,
    )
