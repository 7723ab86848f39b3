"""Scorers of what the request itself would see on each backend, from the cycle's predictions.

- `TtftScorer`: the pool's best predicted TTFT over this backend's: 1 for the fastest, falling
  towards 0 as the prediction grows; 0 for a backend that could never fit the prompt.
- `PrefillLoadScorer`: the share of the backend's time that its recent prefills, this prompt's
  included, leave to decoding (1 - `Prediction.prefill_busy_after`). Interleaved prefill
  stretches every decode step there; on a mixed fleet the TTFT score alone would send the long
  prompts to the fastest prefill, loading those backends' steps until their TPOT and queue
  rise, so this spreads the prefill load in proportion to each backend's prefill speed.
- `PreemptionScorer`: one minus the predicted risk that admitting the request drives the
  backend to preempt. A backend whose metrics are stale or missing is predicted as its ledger
  reads it, a penalty included (routing/scheduling/ledger_view.py), so a fresh backend is
  preferred to it at equal load and an idle one is not left idle.
A backend without a prediction scores 0. Pure.
"""

from __future__ import annotations

import math

from routing.scheduling.cycle import CycleState
from routing.state import Candidate


class TtftScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        best = cycle.best_ttft_s()
        inf = math.inf
        out: list[float] = []
        for pred in cycle.predictions_of(candidates):
            if pred is None:
                out.append(0.0)
                continue
            ttft = pred.predicted_ttft_s
            if not ttft < inf:  # never fits (inf), or no figure (NaN)
                out.append(0.0)
            elif ttft <= 0.0:
                out.append(1.0)
            else:
                out.append(best / ttft)
        return out


class PrefillLoadScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        return [0.0 if p is None else max(0.0, 1.0 - p.prefill_busy_after)
                for p in cycle.predictions_of(candidates)]


class PreemptionScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        return [0.0 if p is None else 1.0 - p.preemption_risk
                for p in cycle.predictions_of(candidates)]
