"""What one routing decision knows beyond a single backend: the request's cost and prefix chain,
each candidate's predicted TTFT, and the few fleet-wide figures scorers compare against.

Scorers see one candidate at a time (`Scorer.score(request, candidate)`); figures that only make
sense relative to the other candidates (the best predicted TTFT, the range of queue depths, the
mean load) are computed once per decision here, by `build_context`, and travel on the
`RouteRequest`. Pure: values in, values out.

Rules
- A backend is *admissible* for a request when its prediction fits under the KV high-water mark
  and the risk that admitting it drives the backend into preemption is at most `max_risk`. A
  backend whose KV capacity is unknown cannot be judged and counts as admissible (ranked by load).
- Load figures: `inflight` is the gateway's own count (what least-request and bounded-load hashing
  use); `queue_depth` is the backend's waiting queue as last scraped plus what the gateway sent
  since, or the gateway's in-flight count when the snapshot is stale or missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from routing.cost import RequestCost
from routing.prefix import PrefixChain
from routing.state import Candidate
from routing.ttft import Prediction

DEFAULT_MAX_RISK = 0.1
_EMPTY_PREDICTIONS: Mapping[str, Prediction] = MappingProxyType({})
_EMPTY_COUNTS: Mapping[str, int] = MappingProxyType({})
_EMPTY_WEIGHTS: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RouteContext:
    """Per-decision facts, computed over the candidates handed to the router (the pool)."""

    cost: RequestCost
    chain: PrefixChain | None = None
    session_backend: str | None = None  # the backend this request's session last went to
    predictions: Mapping[str, Prediction] = field(default_factory=lambda: _EMPTY_PREDICTIONS)
    # Leading prefix-chain blocks each backend likely holds (absent: none).
    matched_blocks: Mapping[str, int] = field(default_factory=lambda: _EMPTY_COUNTS)
    admissible: frozenset[str] = frozenset()  # backend ids that pass the KV rule
    best_ttft_s: float = 0.0  # the lowest predicted TTFT in the pool
    # The pool's in-flight counts and configured weights, by backend id.
    inflight: Mapping[str, int] = field(default_factory=lambda: _EMPTY_COUNTS)
    weights: Mapping[str, float] = field(default_factory=lambda: _EMPTY_WEIGHTS)
    inflight_total: int = 0  # the pool's in-flight requests, summed
    pool_size: int = 0
    queue_min: float = 0.0  # the pool's range of queue depths
    queue_max: float = 0.0
    # Replies each backend's speed has been learned from (absent: none; routing/probe.py).
    measured: Mapping[str, int] = field(default_factory=lambda: _EMPTY_COUNTS)


def is_admissible(prediction: Prediction, max_risk: float = DEFAULT_MAX_RISK) -> bool:
    """Fits under the high-water mark with an acceptable preemption risk (module rule)."""
    if prediction.free_blocks is None:  # KV capacity unknown: nothing to judge by
        return prediction.fits
    return prediction.fits and prediction.preemption_risk <= max_risk


def queue_depth(candidate: Candidate) -> float:
    snap = candidate.snapshot
    if snap is None or candidate.stale or snap.waiting is None:
        return float(candidate.inflight)
    return float(snap.waiting + candidate.dispatched_since_scrape)


def kv_utilization(candidate: Candidate) -> float | None:
    """Fraction of KV in use, counting blocks the gateway sent since the scrape; None if unknown.
    A stale snapshot is never read as emptier than the gateway's own reservations."""
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


def build_context(
    pool: Sequence[Candidate],
    cost: RequestCost,
    *,
    predictions: Mapping[str, Prediction] = _EMPTY_PREDICTIONS,
    chain: PrefixChain | None = None,
    matched_blocks: Mapping[str, int] = _EMPTY_COUNTS,
    session_backend: str | None = None,
    max_risk: float = DEFAULT_MAX_RISK,
    measured: Mapping[str, int] = _EMPTY_COUNTS,
) -> RouteContext:
    """The context for routing `cost`'s request among `pool`. `predictions` may cover more
    backends than the pool; only the pool's count towards the fleet-wide figures."""
    best = math.inf
    inflight: dict[str, int] = {}
    weights: dict[str, float] = {}
    admissible: set[str] = set()
    queue_min, queue_max = math.inf, -math.inf
    for c in pool:
        cid = c.spec.id
        inflight[cid] = c.inflight
        weights[cid] = c.spec.weight
        q = queue_depth(c)
        queue_min, queue_max = min(queue_min, q), max(queue_max, q)
        pred = predictions.get(cid)
        if pred is not None:
            best = min(best, pred.predicted_ttft_s)
            if is_admissible(pred, max_risk):
                admissible.add(cid)
    return RouteContext(
        cost=cost,
        chain=chain,
        session_backend=session_backend,
        predictions=predictions,
        matched_blocks=matched_blocks,
        admissible=frozenset(admissible),
        best_ttft_s=0.0 if best == math.inf else best,
        inflight=inflight,
        weights=weights,
        inflight_total=sum(inflight.values()),
        pool_size=len(pool),
        queue_min=0.0 if not pool else queue_min,
        queue_max=0.0 if not pool else queue_max,
        measured=measured,
    )
