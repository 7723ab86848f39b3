"""A candidate's load as the load-based scorers read it. Pure: a `Candidate` in, a figure out.

- `queue_depth`: the backend's waiting queue as last scraped plus what the gateway sent since, or
  the gateway's in-flight count when the snapshot is stale or missing.
- `kv_utilization`: the fraction of its KV in use, counting the blocks the gateway sent since the
  scrape; a stale snapshot is never read as emptier than the gateway's own reservations.
"""

from __future__ import annotations

from routing.state import Candidate


def queue_depth(candidate: Candidate) -> float:
    snap = candidate.snapshot
    if snap is None or candidate.stale or snap.waiting is None:
        return float(candidate.inflight)
    return float(snap.waiting + candidate.dispatched_since_scrape)


def kv_utilization(candidate: Candidate) -> float | None:
    """None when the backend reports no KV figure."""
    snap = candidate.snapshot
    if snap is None:
        return None
    total = snap.kv_total_blocks
    if total:
        if snap.kv_free_blocks is not None:
            used = float(total - snap.kv_free_blocks)
        elif snap.kv_usage is not None:
            used = snap.kv_usage * total
        else:
            return None
        used += candidate.blocks_since_scrape
        if candidate.stale:
            used = max(used, float(candidate.reserved_blocks))
        return min(1.0, used / total)
    return snap.kv_usage
