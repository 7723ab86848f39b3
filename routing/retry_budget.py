"""The retry budget: how many failed attempts may be tried again at once (Envoy's retry budget).

A retry is allowed while the retries running stay under `ratio` of the requests in flight, with a
floor of `min_concurrent`, so a fault of the whole fleet never multiplies the load on it: with 10
requests in flight all failing, 3 are tried again and 7 get their failure as is; with 100, 20.
The budget counts what is running, not a rate: a retry gives its share back when it ends.

`RetryBudget` is plain counting: no clock, no await. The caller marks each request `started` and
`ended` (every path); when an attempt failed before the first byte it asks `allows`, and takes a
share with `take` once the retry is placed, giving it back with `retry_ended` when that retried
attempt is over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_RATIO = 0.2
DEFAULT_MIN_CONCURRENT = 3


def retry_allowed(in_flight: int, retrying: int, *, ratio: float = DEFAULT_RATIO,
                  min_concurrent: int = DEFAULT_MIN_CONCURRENT) -> bool:
    """One more retry fits: the retries running stay below `ratio` of the requests in flight
    (rounded down), or below `min_concurrent` whatever the traffic."""
    return retrying < max(min_concurrent, math.floor(ratio * in_flight))


@dataclass(slots=True)
class RetryBudget:
    """The requests in flight and the retries among them, for one gateway."""

    ratio: float = DEFAULT_RATIO
    min_concurrent: int = DEFAULT_MIN_CONCURRENT
    in_flight: int = 0
    retrying: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError("ratio must be within [0, 1]")
        if self.min_concurrent < 0:
            raise ValueError("min_concurrent must not be negative")

    def started(self) -> None:
        self.in_flight += 1

    def ended(self) -> None:
        self.in_flight -= 1

    def allows(self) -> bool:
        """One more retry fits now; False: the failure stands as it is."""
        return retry_allowed(self.in_flight, self.retrying, ratio=self.ratio,
                             min_concurrent=self.min_concurrent)

    def take(self) -> None:
        self.retrying += 1

    def retry_ended(self) -> None:
        self.retrying -= 1
