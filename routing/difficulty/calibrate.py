"""From a share of hard prompts an alias may send small to the score threshold that keeps it.

A prompt goes small when its score is strictly below the threshold. Against a calibration set of
hard prompts' scores (ascending), the threshold for a share s is the score of the hard prompt at
rank floor(s * n): the floor(s * n) lowest-scored ones fall below it, ties at it do not, so at
most that share is sent small.

Under pressure on the large pool the threshold in force rises by the alias's step, but never
past its ceiling: the threshold of the most hard prompts the alias may ever send small (and
never below its own base threshold).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

ALWAYS_HARD = 0.0  # a threshold nothing scores under: every prompt goes large
NEVER_HARD = math.nextafter(1.0, 2.0)  # above every score: every prompt goes small


def threshold_for_share(hard_scores: Sequence[float], share: float) -> float:
    """The highest threshold sending at most `share` of `hard_scores` (ascending) small."""
    if not hard_scores:
        return ALWAYS_HARD
    allowed = math.floor(share * len(hard_scores) + 1e-9)
    if allowed >= len(hard_scores):
        return NEVER_HARD
    return hard_scores[allowed]


def share_below(scores: Sequence[float], threshold: float) -> float:
    """The share of `scores` (ascending) strictly below `threshold`: the share sent small."""
    if not scores:
        return 0.0
    return bisect_left(scores, threshold) / len(scores)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """An alias's thresholds: `base` in normal times, raised by `step` under pressure, never past
    `ceiling`."""

    base: float
    step: float
    ceiling: float

    def in_force(self, pressure: bool) -> float:
        if not pressure:
            return self.base
        return max(self.base, min(self.base + self.step, self.ceiling))


def thresholds(hard_scores: Sequence[float], *, max_hard_share: float, threshold: float | None,
               step: float, pressure_max_hard_share: float) -> Thresholds:
    """An alias's thresholds: its own `threshold` when set, else the one meeting
    `max_hard_share`; the ceiling is the threshold meeting `pressure_max_hard_share`."""
    base = threshold if threshold is not None else threshold_for_share(hard_scores,
                                                                        max_hard_share)
    return Thresholds(base=base, step=step,
                      ceiling=threshold_for_share(hard_scores, pressure_max_hard_share))
