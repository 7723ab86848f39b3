"""A simulated backend's scrape, built straight from its engine's stats.

`kvgate sim` renders `EngineStats` as vLLM V1's /metrics text and the gateway's poller parses it
back (`routing.metrics.parse_metrics`). Doing that at every scrape of a long simulation would cost
more than the engines; `snapshot` computes the very same `BackendSnapshot` from the stats
directly, with the parser's arithmetic (tests hold the two equal on the same engine states):
- V1 reserves one null block: free = round((1 - usage) * (num_gpu_blocks - 1)), and the usage it
  reports back is the pool-weighted mean over engines, which for one engine is usage * pool / pool
  (not always bit-identical to usage, hence computed the same way);
- prefix-cache hit rate: lifetime hits over queries, None before the first query;
- the model named by the series' `model_name` label.
"""

from __future__ import annotations

from loadtest.sim.engine import EngineStats
from routing.state import BackendSnapshot


def snapshot(stats: EngineStats, *, model: str, taken_at: float) -> BackendSnapshot:
    """What the gateway reads from the simulator's vLLM V1 /metrics in the state `stats`."""
    usage = min(1.0, max(0.0, stats.kv_usage))
    pool = stats.num_gpu_blocks - 1
    total_blocks: int | None = stats.num_gpu_blocks
    free_blocks: int | None = round((1.0 - usage) * pool)
    reported_usage = usage * pool / pool if pool > 0 else usage
    if pool <= 0:  # the parser cannot size a pool of one block: usage only
        total_blocks = free_blocks = None
    queries, hits = stats.prefix_queries_tokens, stats.prefix_hits_tokens
    return BackendSnapshot(
        taken_at=taken_at,
        format="vllm",
        kv_total_blocks=total_blocks,
        kv_free_blocks=free_blocks,
        kv_usage=reported_usage,
        block_size=stats.block_size,
        running=stats.running,
        waiting=stats.waiting,
        preemptions=stats.preemptions_total,
        prefix_cache_hit_rate=min(1.0, hits / queries) if queries > 0 else None,
        models=(model,),
    )
