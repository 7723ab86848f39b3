"""The pickers: the one choice among the scored survivors. Randomness only from the injected
`random.Random`, drawn in a fixed order, so a seeded router repeats its decisions.

- `MaxScorePicker`: the highest score; ties broken uniformly at random (no draw without a tie).
- `RoundRobinPicker`: rotates through the best-scored candidates in id order; the cursor starts
  at a random offset so that gateway replicas started together do not all begin on one backend.
- `RandomPicker`: uniformly at random among the survivors, whatever their scores.
- `PowerOfTwoPicker`: two distinct survivors drawn at random, the higher-scored of the two (the
  first drawn on a tie): near-least-loaded placement without herding onto one backend.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from routing.policy import Scored
from routing.state import Candidate


class MaxScorePicker:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        best = max(s.score for s in scored)
        ties = [s.candidate for s in scored if s.score == best]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)


class RoundRobinPicker:
    def __init__(self, rng: random.Random) -> None:
        self._cursor = rng.randrange(1 << 30)

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        best = max(s.score for s in scored)
        ties = sorted((s.candidate for s in scored if s.score == best), key=lambda c: c.id)
        chosen = ties[self._cursor % len(ties)]
        self._cursor += 1
        return chosen


class RandomPicker:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        return scored[0].candidate if len(scored) == 1 else self._rng.choice(scored).candidate


class PowerOfTwoPicker:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        if len(scored) == 1:
            return scored[0].candidate
        a, b = self._rng.sample(range(len(scored)), 2)
        return (scored[b] if scored[b].score > scored[a].score else scored[a]).candidate
