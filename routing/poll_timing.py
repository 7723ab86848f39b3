"""The poller's pure time arithmetic: how often a backend on a tiered path asks for every name
(`full_every_for`), and when a failing backend is scraped next (`retry_delay`).

Contract
- Functions of their arguments alone: no I/O, no clock, no state. `interval`, `backoff_max` and
  the delay returned are seconds.
- Public: the gateway (`full_every_for`, for `routing.full_scrape_interval_s`) and the tests import
  them from routing.poller, which re-exports them.
"""

from __future__ import annotations


def full_every_for(full_interval: float, interval: float) -> int:
    """`Poller`'s `full_every` for a scrape of every name about every `full_interval` seconds
    when polling every `interval`: 1 (every name at every scrape) when that is not longer."""
    if full_interval <= 0 or interval <= 0:
        raise ValueError("need positive intervals")
    return max(1, round(full_interval / interval))


def retry_delay(interval: float, failures: int, threshold: int, backoff_max: float) -> float:
    """Time to the next scrape: the interval while fewer than `threshold` scrapes in a row have
    failed, then doubling with each further failure, up to `backoff_max`."""
    if failures < threshold:
        return interval
    return min(backoff_max, interval * 2.0 ** min(failures - threshold + 1, 32))
