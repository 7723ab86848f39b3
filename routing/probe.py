"""Measuring a backend the gateway knows too little about: while a backend's speed rests on fewer
than `BOOTSTRAP_TPOTS` replies, it gets a request whenever it is idle.

`cost` sends a request where its predictions say it is served best, and the predictions use each
backend's learned speed (routing/ttft.py). A backend learned slower than it is gets nothing, so it
is never measured again and the mistake stands: live, a card's first few first tokens came 5-20x
later than predicted (connections and the engine's queue at a cold start), it was read 5.7x slower
than the reference where its replies showed 3.4x, and at light load it then served none of the
last 200 requests, long prompts it should have taken included (loadtest/README.md, session 9).
An idle backend costs little to measure: the request it gets runs alone there.

The rule (`SpeedProbeFilter`), after the other filters, for a request that can teach a speed: a
stream (its first token and TPOT are measured), or a whole answer allowed `WHOLE_ANSWER_MIN_TOKENS`
tokens or more (routing/jobs.py: its duration is read as a TPOT):
- a candidate is *under-measured* when its speed has been learned from fewer than
  `replies_needed` replies (`RouteContext.measured`), and *idle* when none of this gateway's
  requests is in flight there;
- when some candidates are under-measured and idle and others are not, the request goes to the
  one measured least (then the first in pool order), provided its predicted TTFT there is within
  `ttft_budget_s`: the prediction is made at the speed learned so far, which errs slow, so the
  probe is a request that would be served soon even then;
- a backend is probed at most `max_probes` times, so one whose answers never yield a TPOT
  (one-token replies) is not probed forever.
At a cold start every backend is under-measured and idle, so the first requests spread one per
backend; under load no backend stays idle and the rule does nothing. Pure apart from its count of
probes sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.jobs import WHOLE_ANSWER_MIN_TOKENS
from routing.policy import RouteRequest
from routing.state import Candidate
from routing.ttft import BOOTSTRAP_TPOTS

DEFAULT_PROBE_TTFT_BUDGET_S = 0.3
DEFAULT_MAX_PROBES = 2 * BOOTSTRAP_TPOTS


class SpeedProbeFilter:
    """Sends a request to an idle, under-measured backend (module docstring)."""

    def __init__(self, *, replies_needed: int = BOOTSTRAP_TPOTS,
                 ttft_budget_s: float = DEFAULT_PROBE_TTFT_BUDGET_S,
                 max_probes: int = DEFAULT_MAX_PROBES) -> None:
        if replies_needed < 1 or max_probes < 1 or not ttft_budget_s > 0.0:
            raise ValueError("replies_needed and max_probes must be >= 1, ttft_budget_s > 0")
        self._needed = replies_needed
        self._budget = ttft_budget_s
        self._max_probes = max_probes
        self._probes: dict[str, int] = {}

    def probes_sent(self, backend_id: str) -> int:
        return self._probes.get(backend_id, 0)

    def filter(self, request: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        kept = list(candidates)
        ctx = request.context
        if ctx is None or len(kept) < 2 or not (
                request.stream or request.max_tokens is None
                or request.max_tokens >= WHOLE_ANSWER_MIN_TOKENS):
            return kept
        measured, predictions = ctx.measured, ctx.predictions
        best: Candidate | None = None
        best_replies = self._needed
        idle_unmeasured = 0
        for c in kept:
            replies = measured.get(c.id, 0)
            if replies >= self._needed or c.inflight:
                continue
            idle_unmeasured += 1
            pred = predictions.get(c.id)
            if (replies < best_replies and pred is not None
                    and pred.predicted_ttft_s <= self._budget
                    and self._probes.get(c.id, 0) < self._max_probes):
                best, best_replies = c, replies
        if best is None or idle_unmeasured == len(kept):
            return kept
        self._probes[best.id] = self._probes.get(best.id, 0) + 1
        return [best]
