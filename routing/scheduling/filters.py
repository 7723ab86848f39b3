"""The basic filters: only healthy backends, and only backends the request fits on.

- `HealthyFilter`: only backends currently marked healthy.
- `HighWaterFilter`: only backends that pass the KV rule (`CycleState.admissible`: the request
  fits under the high-water mark at an acceptable preemption risk). When none does, admission
  has already decided to send it anyway (too large for any backend, or admission off), so every
  candidate passes and the scorers decide.
Pure: they read the cycle state and return a new list (or, when they keep every candidate,
the list they were given, unchanged).
"""

from __future__ import annotations

from routing.scheduling.cycle import CycleState
from routing.state import Candidate


class HealthyFilter:
    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        for c in candidates:
            if not c.healthy:
                return [c for c in candidates if c.healthy]
        return candidates  # every one is: the list as it came


class HighWaterFilter:
    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        admissible = cycle.admissible
        if candidates is cycle.pool and len(admissible) == len(candidates):
            return candidates  # admissible ids are pool ids: the whole pool is admissible
        kept = [c for c in candidates if c.spec.id in admissible]
        return kept or list(candidates)
