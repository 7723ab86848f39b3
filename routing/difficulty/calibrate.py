"""From a share of hard prompts an alias may send small to the score threshold that keeps it.

A prompt goes small when its score is strictly below the threshold. Against a calibration set of
hard prompts' scores (ascending), the threshold for a share s is the score of the hard prompt at
rank floor(s * n): the floor(s * n) lowest-scored ones fall below it, ties at it do not, so at
most that share is sent small.

An alias's own thresholds are calibrated conservatively (`conservative_threshold`): the share is
read as a bound on the hard prompts the alias has not seen, so the threshold lets through only
as many of the calibration set's hard prompts as keep the upper end of a one-sided 95% Wilson
interval of that share within s. Of 300 calibration hard prompts and s = 5%, that is 8 (2.7%),
not 15: the calibration set is finite, and prompts from elsewhere score differently.

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


CONFIDENCE_Z = 1.645  # one-sided 95%


def wilson_upper(count: int, total: int, z: float = CONFIDENCE_Z) -> float:
    """The upper end of the Wilson score interval of the share `count` / `total`."""
    if total <= 0:
        return 1.0
    share = count / total
    centre = share + z * z / (2 * total)
    spread = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total))
    return min(1.0, (centre + spread) / (1 + z * z / total))


def conservative_threshold(hard_scores: Sequence[float], share: float,
                           z: float = CONFIDENCE_Z) -> float:
    """The highest threshold sending so few of `hard_scores` (ascending) small that the upper
    Wilson bound of the share stays within `share`; when even none is too many for the bound
    (a small calibration set), the threshold sending none of them small."""
    if not hard_scores:
        return ALWAYS_HARD
    total = len(hard_scores)
    allowed = 0
    while allowed < total and wilson_upper(allowed + 1, total, z) <= share + 1e-12:
        allowed += 1
    if allowed >= total:
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
    `max_hard_share` conservatively; the ceiling is the one meeting `pressure_max_hard_share`
    (conservatively too)."""
    base = threshold if threshold is not None else conservative_threshold(hard_scores,
                                                                           max_hard_share)
    return Thresholds(base=base, step=step,
                      ceiling=conservative_threshold(hard_scores, pressure_max_hard_share))
