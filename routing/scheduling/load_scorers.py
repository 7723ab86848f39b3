"""Load scorers, after the baselines they stand for.

- `LeastRequestScorer`: fewer requests in flight from this gateway is better: 1 / (1 + in flight).
- `QueueScorer`: the Gateway API Inference Extension's queue scorer: the shortest waiting queue
  in the pool scores 1, the longest 0, linearly between; all equal scores 1.
- `KvUtilizationScorer`: the Inference Extension's KV-cache scorer: the free fraction of the KV
  cache; a backend that reports no KV figure scores `UNKNOWN_KV_SCORE`, neither favoured nor
  shunned, and one whose metrics are stale or missing at most that: what it has free now is not
  known, so a fresh backend with room is preferred to it (it stays a candidate, routed by the
  gateway's ledger).
Pure.
"""

from __future__ import annotations

from routing.load import kv_utilization, queue_depth
from routing.scheduling.cycle import CycleState
from routing.state import Candidate

UNKNOWN_KV_SCORE = 0.5


class LeastRequestScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        return [1.0 / (1.0 + c.inflight) for c in candidates]


class QueueScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        low, high = cycle.queue_range()
        spread = high - low
        if spread <= 0.0:
            return [1.0] * len(candidates)
        return [(high - queue_depth(c)) / spread for c in candidates]


class KvUtilizationScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        out: list[float] = []
        for c in candidates:
            used = kv_utilization(c)
            free = UNKNOWN_KV_SCORE if used is None else 1.0 - used
            out.append(min(free, UNKNOWN_KV_SCORE) if c.stale else free)
        return out
