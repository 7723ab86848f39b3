"""Figures of a threshold over labelled scores: the confusion matrix and the shares that matter.

`small` is the prediction "easy, send it small" (score below the threshold); a hard prompt sent
small is the costly error (a wrong answer), an easy one sent large only costs capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.difficulty.calibrate import threshold_for_share


@dataclass(frozen=True, slots=True)
class Confusion:
    easy_small: int  # easy prompts sent small (right)
    easy_large: int  # easy prompts sent large (capacity lost)
    hard_small: int  # hard prompts sent small (wrong answers)
    hard_large: int  # hard prompts sent large (right)

    @property
    def hard_small_share(self) -> float:
        hard = self.hard_small + self.hard_large
        return self.hard_small / hard if hard else 0.0

    @property
    def easy_small_share(self) -> float:
        easy = self.easy_small + self.easy_large
        return self.easy_small / easy if easy else 0.0

    @property
    def small_share(self) -> float:
        total = self.easy_small + self.easy_large + self.hard_small + self.hard_large
        return (self.easy_small + self.hard_small) / total if total else 0.0


def confusion(scored: Sequence[tuple[float, bool]], threshold: float) -> Confusion:
    """The confusion matrix of (score, hard) pairs at `threshold`."""
    counts = [0, 0, 0, 0]
    for value, hard in scored:
        counts[2 * hard + (value >= threshold)] += 1
    return Confusion(*counts)


def meeting(scored: Sequence[tuple[float, bool]], max_hard_share: float) -> float:
    """The highest threshold sending at most `max_hard_share` of these hard prompts small."""
    return threshold_for_share(sorted(value for value, hard in scored if hard), max_hard_share)
