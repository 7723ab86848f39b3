"""The poller's pure time arithmetic: how often a backend on a tiered path asks for every name
(`full_every_for`), when a failing backend is scraped next (`retry_delay`), and a reused snapshot
stamped with the time of the scrape that reused it (`restamped`).

Contract
- Functions of their arguments alone: no I/O, no clock, no state. `interval`, `backoff_max` and
  the delay returned are seconds; `taken_at` is a time of the poller's clock (monotonic seconds).
- Public: the gateway (`full_every_for`, for `routing.full_scrape_interval_s`) and the tests import
  them from routing.poller, which re-exports them.
- `restamped` runs at nearly every scrape of an idle backend (routing/poller.py: Re-use), hence
  `tuple.__new__` rather than `_replace`; it relies on `taken_at` being `BackendSnapshot`'s first
  field, asserted at import.
"""

from __future__ import annotations

from functools import partial

from routing.state import BackendSnapshot


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


assert BackendSnapshot._fields[0] == "taken_at"  # what `restamped` replaces
_new_snapshot = partial(tuple.__new__, BackendSnapshot)


def restamped(snapshot: BackendSnapshot, taken_at: float) -> BackendSnapshot:
    """`snapshot` with another `taken_at`: `_replace`, in fewer steps."""
    return _new_snapshot((taken_at, *snapshot[1:]))
