"""Measuring a backend the gateway knows too little about: while a backend's speed rests on fewer
than `replies_needed` replies, it gets a request whenever it is idle.

`cost` sends a request where its predictions say it is served best, and the predictions use each
backend's learned speed (routing/speed.py). A backend learned slower than it is gets nothing, so
it is never measured again and the mistake stands: a card's first few first tokens can come many
times later than predicted (connections and the engine's queue at a cold start), and a backend
read that slow would then serve nothing at light load, long prompts it should take included. An
idle backend costs little to measure: the request it gets runs alone there.

The rule (`SpeedProbeFilter`), after the other filters, for a request that can teach a speed: a
stream (its first token and TPOT are measured), or a whole answer allowed `WHOLE_ANSWER_MIN_TOKENS`
tokens or more (routing/jobs.py: its duration is read as a TPOT):
- a candidate is *under-measured* when its speed has been learned from fewer than
  `replies_needed` replies (`CycleState.measured`), and *idle* when none of this gateway's
  requests is in flight there;
- when some candidates are under-measured and idle and others are not, the request goes to the
  one measured least (then the first in pool order), provided its predicted TTFT there is within
  `ttft_budget_s`: the prediction is made at the speed learned so far, which errs slow, so the
  probe is a request that would be served soon even then;
- a backend is probed at most `max_probes` times, so one whose answers never yield a TPOT
  (one-token replies) is not probed forever.
At a cold start every backend is under-measured and idle, so the first requests spread one per
backend; under load no backend stays idle and the rule does nothing. `filter` only reads; the
probes sent are counted by `dispatched`, when the filter's choice was dispatched.
"""

from __future__ import annotations

from dataclasses import dataclass

from routing.jobs import WHOLE_ANSWER_MIN_TOKENS
from routing.policy import Decision
from routing.scheduling.cycle import CycleState
from routing.state import Candidate
from routing.ttft import BOOTSTRAP_TPOTS


@dataclass(frozen=True, slots=True)
class ProbeParams:
    replies_needed: int = BOOTSTRAP_TPOTS
    ttft_budget_s: float = 0.3
    max_probes: int = 2 * BOOTSTRAP_TPOTS

    def __post_init__(self) -> None:
        if self.replies_needed < 1 or self.max_probes < 1 or not self.ttft_budget_s > 0.0:
            raise ValueError("replies_needed and max_probes must be >= 1, ttft_budget_s > 0")


class SpeedProbeFilter:
    """Sends a request to an idle, under-measured backend (module docstring)."""

    def __init__(self, params: ProbeParams | None = None) -> None:
        self._params = params or ProbeParams()
        self._probes: dict[str, int] = {}

    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        if len(candidates) < 2 or not (
                cycle.stream or cycle.max_tokens is None
                or cycle.max_tokens >= WHOLE_ANSWER_MIN_TOKENS):
            return candidates
        p = self._params
        measured, predictions, probes = cycle.measured, cycle.predictions, self._probes
        best: Candidate | None = None
        best_replies = p.replies_needed
        idle_unmeasured = 0
        for c in candidates:
            cid = c.spec.id
            replies = measured.get(cid, 0)
            if replies >= p.replies_needed or c.inflight:
                continue
            idle_unmeasured += 1
            pred = predictions.get(cid)
            if (replies < best_replies and pred is not None
                    and pred.predicted_ttft_s <= p.ttft_budget_s
                    and probes.get(cid, 0) < p.max_probes):
                best, best_replies = c, replies
        if best is None or idle_unmeasured == len(candidates):
            return candidates
        return [best]

    def dispatched(self, cycle: CycleState, decision: Decision) -> None:
        """Counts a probe when this filter's choice was the one dispatched."""
        if decision.narrowed_by is self:
            backend = decision.backend_id
            self._probes[backend] = self._probes.get(backend, 0) + 1
