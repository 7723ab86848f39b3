"""Long prompts to slower backends: on a fleet of mixed speeds, a prompt much longer than the
recent ones goes to a slower backend when one can still give it its first token soon.

Every prompt a backend prefills stretches the decode steps of every reply running there. On a
mixed fleet the fast backends carry most of the replies, so a long prompt's prefill there slows
many streams, while a slower backend, whose replies run at a slower pace anyway, can take it and
still answer it quickly. Per request, every latency score prefers the fast prefill for a long
prompt (it is where its own first token comes soonest), so left to them the fast backends get
every long prompt and the slow ones the short: the fast backends' steps fill with prefill and the
typical reply streams slower than on a naive policy. This rule is size-interval assignment the
other way round: the longest prompts to the slowest backends, within the SLOs. It trades the
long prompts' own tail (their replies run nearer the TPOT target on the slower backends) for the
typical reply's speed.

The rule (`PrefillOffloadFilter`), among the candidates that passed the KV and SLO admission:
- a backend is *slower* when its bare decode step (`Prediction.tpot_idle_s`) is at least
  `slower_factor` times the fastest candidate's; a fleet with none (one speed) is left alone;
- a prompt is *long* when its prefill where it costs least (`CycleState.cheapest_prefill_s`:
  its uncached tokens on the fastest prefill, so a conversation whose history a backend holds is
  not long) is at least `ratio` times the median of the last `window` prompts' for its model
  (none before `min_seen` of them): a relative measure, so a workload of equally long prompts
  (one shared document, questions of one size) is left alone;
- a long prompt keeps only the slower backends whose predicted TTFT is within `ttft_budget_s`
  and whose replies, with it there, stay within the TPOT SLO (`Prediction.tpot_others_s`, and
  its own `predicted_tpot_s`); when there is none, every candidate stays.
`filter` only reads; the window of recent sizes is learned by `dispatched`, once per dispatch.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from routing.policy import Decision
from routing.scheduling.cycle import CycleState
from routing.slo import SloTargets
from routing.state import Candidate

DEFAULT_WINDOW = 512


@dataclass(frozen=True, slots=True)
class OffloadParams:
    ratio: float = 2.0  # a long prompt: at least this many times the recent median
    slower_factor: float = 1.5  # a bare decode step this many times the fastest's: slower
    ttft_budget_s: float = 0.3  # the first token a slower backend must promise a long prompt
    window: int = DEFAULT_WINDOW  # prompts the median is taken over, per model
    min_seen: int = 64  # prompts of a model seen before any is called long

    def __post_init__(self) -> None:
        if not self.ratio > 0.0 or not self.ttft_budget_s > 0.0 or not self.slower_factor > 0.0:
            raise ValueError("ratio, slower_factor and ttft_budget_s must be > 0")
        if self.window < 1 or self.min_seen < 1:
            raise ValueError("window and min_seen must be >= 1")


@dataclass(slots=True)
class RecentSizes:
    """The last `window` values, kept sorted for their median. `add` costs O(window)."""

    window: int = DEFAULT_WINDOW
    _order: deque[float] = field(default_factory=deque)
    _sorted: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._sorted)

    def median(self) -> float:
        return self._sorted[len(self._sorted) // 2]

    def add(self, value: float) -> None:
        bisect.insort(self._sorted, value)
        self._order.append(value)
        if len(self._order) > self.window:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]


class PrefillOffloadFilter:
    """Keeps only slower backends that can serve a long prompt well (module docstring)."""

    def __init__(self, slo: SloTargets | None = None, params: OffloadParams | None = None
                 ) -> None:
        self._params = params or OffloadParams()
        self._tpot_target = (slo or SloTargets()).tpot_s
        self._sizes: dict[str, RecentSizes] = {}

    def is_long(self, model: str, prefill_s: float) -> bool:
        sizes = self._sizes.get(model)
        p = self._params
        return (sizes is not None and len(sizes) >= p.min_seen and prefill_s > 0.0
                and prefill_s >= p.ratio * sizes.median())

    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        if not self.is_long(cycle.model, cycle.cheapest_prefill_s()):
            return candidates
        predictions = cycle.predictions
        preds = []
        fastest = math.inf
        for c in candidates:
            pred = predictions.get(c.spec.id)
            if pred is None:
                return candidates
            preds.append(pred)
            if pred.tpot_idle_s < fastest:
                fastest = pred.tpot_idle_s
        slower = self._params.slower_factor * fastest
        if not slower > 0.0:
            return candidates
        budget, target = self._params.ttft_budget_s, self._tpot_target
        offload = [
            c for c, p in zip(candidates, preds, strict=True)
            if p.tpot_idle_s >= slower and p.predicted_ttft_s <= budget
            and p.tpot_others_s <= target and p.predicted_tpot_s <= target
        ]
        return offload or candidates

    def dispatched(self, cycle: CycleState, decision: Decision) -> None:
        """Learns the dispatched prompt's size into its model's window."""
        sizes = self._sizes.get(cycle.model)
        if sizes is None:
            sizes = self._sizes[cycle.model] = RecentSizes(self._params.window)
        sizes.add(cycle.cheapest_prefill_s())
