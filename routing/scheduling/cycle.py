"""The cycle state: everything one routing decision knows, written once per request before the
router runs, read by every filter and scorer.

The Dispatcher's data producer (routing/scheduling/facts.py) fills in, per candidate, the TTFT
prediction and its parts (KV fit, preemption risk, TPOT before and after), the prefix blocks the
backend likely holds, the committed peak the request would add and its uncached prompt; the
admission step (routing/scheduling/admission.py) names the pool the router may choose from.
Figures relative to the whole pool (the best predicted TTFT, the range of queue depths, the
in-flight total) are computed on first use and kept for the rest of the cycle, so a scorer that
needs one pays for it once and the others not at all. Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from routing.cost import RequestCost
from routing.load import queue_depth
from routing.prefix import PrefixChain
from routing.scheduling.ledger_view import stale_queue_depth
from routing.state import Candidate
from routing.ttft import Prediction

_NO_PREDICTIONS: Mapping[str, Prediction] = MappingProxyType({})
_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


def routed_queue_depth(candidate: Candidate) -> float:
    """The queue depth the load policies rank by: `routing.load.queue_depth`, or for a backend
    whose metrics are stale or missing the ledger's reading of it
    (routing/scheduling/ledger_view.py `stale_queue_depth`)."""
    return stale_queue_depth(candidate) if candidate.stale else queue_depth(candidate)


class CycleState:
    """One request's routing cycle. The producer's mappings are keyed by backend id and cover
    every candidate; `pool` is the list handed to the router (a subset, in candidate order)."""

    __slots__ = ("model", "max_tokens", "stream", "cost", "chain", "session_backend",
                 "predictions", "matched", "measured", "pool", "admissible", "_best_ttft",
                 "_queue_range", "_inflight_total", "_cheapest_prefill", "_preds_of",
                 "_preds")

    def __init__(self, model: str, cost: RequestCost, *, max_tokens: int | None = None,
                 stream: bool = False, chain: PrefixChain | None = None,
                 session_backend: str | None = None,
                 predictions: Mapping[str, Prediction] = _NO_PREDICTIONS,
                 matched: Mapping[str, int] = _NO_COUNTS,
                 measured: Mapping[str, int] = _NO_COUNTS,
                 pool: Sequence[Candidate] = (), admissible: frozenset[str] = frozenset()
                 ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.stream = stream
        self.cost = cost
        self.chain = chain
        self.session_backend = session_backend  # the backend this request's session last went to
        self.predictions = predictions
        self.matched = matched  # leading prefix-chain blocks each backend likely holds
        self.measured = measured  # replies each backend's speed has been learned from
        self.pool = pool
        # Pool backends that pass the KV rule (routing/scheduling/admission.py `kv_admissible`).
        self.admissible = admissible
        self._best_ttft: float | None = None
        self._queue_range: tuple[float, float] | None = None
        self._inflight_total = -1
        self._cheapest_prefill: float | None = None
        self._preds_of: list[Candidate] | None = None
        self._preds: list[Prediction | None] = []

    @property
    def prompt_tokens(self) -> int:
        return self.cost.prompt_tokens

    def predictions_of(self, candidates: list[Candidate]) -> list[Prediction | None]:
        """Each candidate's prediction (None without one), aligned with `candidates`; kept for
        the last list asked about, so the scorers of one decision look them up once."""
        if candidates is not self._preds_of:
            predictions = self.predictions
            self._preds = [predictions.get(c.spec.id) for c in candidates]
            self._preds_of = candidates
        return self._preds

    def best_ttft_s(self) -> float:
        """The lowest predicted TTFT in the pool (0 without predictions)."""
        best = self._best_ttft
        if best is None:
            predictions = self.predictions
            best = math.inf
            for c in self.pool:
                pred = predictions.get(c.spec.id)
                if pred is not None and pred.predicted_ttft_s < best:
                    best = pred.predicted_ttft_s
            best = self._best_ttft = 0.0 if best == math.inf else best
        return best

    def queue_range(self) -> tuple[float, float]:
        """The pool's lowest and highest queue depth (`routed_queue_depth`)."""
        span = self._queue_range
        if span is None:
            depths = [routed_queue_depth(c) for c in self.pool]
            span = self._queue_range = (min(depths), max(depths)) if depths else (0.0, 0.0)
        return span

    def inflight_total(self) -> int:
        """The pool's requests in flight from this gateway, summed."""
        total = self._inflight_total
        if total < 0:
            total = self._inflight_total = sum(c.inflight for c in self.pool)
        return total

    def cheapest_prefill_s(self) -> float:
        """The request's own prefill where it costs least (`Prediction.own_prefill_s`) among the
        admissible pool, or the whole pool when none is: how long its prompt is in the fleet's
        terms (a conversation whose history a backend holds is short). inf without predictions."""
        cheapest = self._cheapest_prefill
        if cheapest is None:
            predictions, admissible = self.predictions, self.admissible
            pool = self.pool
            # Admissible ids are pool ids: when there are as many, the pool is all admissible.
            kept = pool if len(admissible) == len(pool) else (
                [c for c in pool if c.spec.id in admissible] or pool)
            cheapest = math.inf
            for c in kept:
                pred = predictions.get(c.spec.id)
                if pred is not None and pred.own_prefill_s < cheapest:
                    cheapest = pred.own_prefill_s
            self._cheapest_prefill = cheapest
        return cheapest
