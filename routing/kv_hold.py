"""What a backend's in-flight requests are held to occupy in KV blocks, together.

Each request brings a `Hold` of three integers, in the backend's KV blocks:
- `own`: its own reservation, its prompt plus its reply at the reservation quantile (what it
  alone would be held to);
- `base`: its prompt plus its expected (mean) reply;
- `spread2`: the square of its reply's margin at the reservation quantile, `z * sd` in blocks
  (z the standard normal quantile of `routing.reservation_quantile`), rounded up.

A set of requests holds `sum base + max(ceil(sqrt(sum spread2)), top)`, never more than
`sum own`, where `top` is the largest `own - base` among them. Replies are independent, so their
total's quantile is about its mean plus z standard deviations of the sum, which grows with the
square root of the count while the sum of each one's own quantile grows with the count; and
whatever the others do, any one of them may still run to its own quantile (`top`: the normal
approximation understates a single long-tailed reply). So one request alone is held to exactly
its own reservation, a set never to less than its expected blocks, and the prompts count exactly
(in `base`).

The sums are integers, so adding and removing requests in any order returns them exactly to
where they were (no drift); the pooled figure is a function of the sums and the top alone, so a
host's worker processes (routing/shared_ledger.py) add their sums and take the largest top
before pooling.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class Hold(NamedTuple):
    own: int
    base: int
    spread2: int


def exact(blocks: int) -> Hold:
    """A hold with no spread: exactly `blocks` (a reply whose length is known)."""
    return Hold(blocks, blocks, 0)


def check(hold: Hold) -> Hold:
    own, base, spread2 = hold
    if base < 0 or spread2 < 0:
        raise ValueError(f"a reservation cannot be negative: {hold}")
    if own < base:
        raise ValueError(f"a reservation holds at least its expected blocks: {hold}")
    return hold


def pooled(own: int, base: int, spread2: int, top: int) -> int:
    """The blocks held by a set whose holds sum to these, `top` the largest `own - base` among
    them (module docstring)."""
    margin = math.isqrt(spread2 - 1) + 1 if spread2 > 0 else 0  # ceil(sqrt(spread2)), exactly
    held = base + (margin if margin > top else top)
    return held if held < own else own


class KVPool:
    """The running sums of a set of holds, and the count of each `own - base` among them (for
    the largest)."""

    __slots__ = ("own", "base", "spread2", "top", "_excess")

    def __init__(self) -> None:
        self.own = self.base = self.spread2 = self.top = 0
        self._excess: dict[int, int] = {}

    def add(self, hold: Hold) -> None:
        own, base, spread2 = hold
        self.own += own
        self.base += base
        self.spread2 += spread2
        excess = own - base
        self._excess[excess] = self._excess.get(excess, 0) + 1
        if excess > self.top:
            self.top = excess

    def remove(self, hold: Hold) -> None:
        own, base, spread2 = hold
        self.own -= own
        self.base -= base
        self.spread2 -= spread2
        excess = own - base
        left = self._excess[excess] - 1
        if left:
            self._excess[excess] = left
        else:
            del self._excess[excess]
            if excess == self.top:
                self.top = max(self._excess, default=0)

    @property
    def held(self) -> int:
        return pooled(self.own, self.base, self.spread2, self.top)


class Commitments:
    """Per backend, the pooled peak of the gateway's requests in flight there: `held` maps a
    backend id to the blocks they hold together (admission reads it)."""

    __slots__ = ("_pools", "held")

    def __init__(self) -> None:
        self._pools: dict[str, KVPool] = {}
        self.held: dict[str, int] = {}

    def add(self, backend_id: str, hold: Hold) -> None:
        pool = self._pools.get(backend_id)
        if pool is None:
            pool = self._pools[backend_id] = KVPool()
        pool.add(hold)
        self.held[backend_id] = pool.held

    def remove(self, backend_id: str, hold: Hold) -> None:
        pool = self._pools[backend_id]
        pool.remove(hold)
        self.held[backend_id] = pool.held
