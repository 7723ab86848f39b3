"""Load scorers, after the baselines they stand for.

- `LeastRequestScorer`: fewer requests in flight from this gateway is better: 1 / (1 + in flight).
- `QueueScorer`: the Gateway API Inference Extension's queue scorer: the shortest waiting queue
  in the pool scores 1, the longest 0, linearly between; all equal scores 1.
- `KvUtilizationScorer`: the Inference Extension's KV-cache scorer: the free fraction of the KV
  cache; a backend that reports no KV figure scores `UNKNOWN_KV_SCORE`, neither favoured nor
  shunned.
A backend whose metrics are stale or missing is read by the gateway's ledger, as holding
`STALE_EXTRA_REQUESTS` more requests than the ledger says (routing/scheduling/ledger_view.py):
its in-flight count and queue are the ledger's plus those, its free KV the ledger's reservations
plus theirs out of its own or its smallest peer's capacity (without any capacity to go by,
`UNKNOWN_KV_SCORE` / (1 + those requests)). So a fresh backend is preferred to it at equal
load, and an idle one beats a fresh one that holds more than the extra. Pure.
"""

from __future__ import annotations

from routing.load import kv_utilization
from routing.scheduling.cycle import CycleState, routed_queue_depth
from routing.scheduling.ledger_view import (
    STALE_EXTRA_REQUESTS,
    peer_capacity_tokens,
    request_tokens,
    stale_kv_free,
    stale_queue_depth,
)
from routing.state import Candidate

UNKNOWN_KV_SCORE = 0.5


class LeastRequestScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        extra = float(STALE_EXTRA_REQUESTS)
        return [1.0 / (1.0 + c.inflight + extra) if c.stale else 1.0 / (1.0 + c.inflight)
                for c in candidates]


class QueueScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        low, high = cycle.queue_range()
        spread = high - low
        if spread <= 0.0:
            return [1.0] * len(candidates)
        return [(high - routed_queue_depth(c)) / spread for c in candidates]


class KvUtilizationScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        out: list[float] = []
        typical: int | None = None
        peer_known = False  # computed once a stale candidate needs it
        for c in candidates:
            if c.stale:
                if not peer_known:
                    typical, peer_known = peer_capacity_tokens(candidates), True
                cost = cycle.cost
                free = stale_kv_free(c, typical, request_tokens(cost.typical_prompt_tokens,
                                                                cost.mean_output_all))
                out.append(UNKNOWN_KV_SCORE / (1.0 + stale_queue_depth(c)) if free is None
                           else free)
                continue
            used = kv_utilization(c)
            out.append(UNKNOWN_KV_SCORE if used is None else 1.0 - used)
        return out
