"""Affinity scorers: prefer the backend that likely holds the request's prefix, or that served
its session last. Preferences, never pins: the other scorers can outweigh them.

- `PrefixAffinityScorer`: the fraction of the prompt's prefix blocks this backend likely holds
  in its cache (`CycleState.matched`). With `load_bound`, a backend above consistent hashing's
  bounded-load cap (one more request would put it above ceil(bound x (pool in flight + 1) /
  pool size)) scores 0, so a hot prefix spills to other backends instead of piling onto one.
- `SessionAffinityScorer`: 1 for the backend this request's session last went to.
- `PrefixHashScorer`: consistent hashing with bounded load: 1 for the backend the ring assigns
  the request's prefix key to (walking on past backends whose in-flight load would exceed
  `bound` x the mean), else 0. The key is the hash chain over the first `depth` prefix blocks
  (model and cache_salt included), so requests sharing that much prefix go to the same backend
  while it has room. The ring (the pool's backends, by configured weight) is rebuilt only when
  the pool changes.
Pure, apart from the ring kept between cycles (a function of the pool it was built for).
"""

from __future__ import annotations

import math

from routing.prefix import HashRing
from routing.scheduling.cycle import CycleState
from routing.state import Candidate

DEFAULT_LOAD_BOUND = 1.25  # bounded-load factor for prefix affinity and hashing
DEFAULT_HASH_BLOCKS = 4  # prefix blocks that form prefix_hash's ring key


class PrefixAffinityScorer:
    def __init__(self, load_bound: float | None = None) -> None:
        self._bound = load_bound

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        chain = cycle.chain
        if chain is None or not chain.blocks:
            return [0.0] * len(candidates)
        blocks = len(chain.blocks)
        matched = cycle.matched
        bound = self._bound
        cap = math.inf
        out: list[float] = []
        for c in candidates:
            m = matched.get(c.spec.id, 0)
            if m == 0:
                out.append(0.0)
                continue
            if bound is not None and cap == math.inf:
                cap = math.ceil(bound * (cycle.inflight_total() + 1) / max(1, len(cycle.pool)))
            out.append(0.0 if c.inflight + 1 > cap else m / blocks)
        return out


class SessionAffinityScorer:
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        session = cycle.session_backend
        if session is None:
            return [0.0] * len(candidates)
        return [1.0 if c.spec.id == session else 0.0 for c in candidates]


class PrefixHashScorer:
    def __init__(self, *, bound: float = DEFAULT_LOAD_BOUND, depth: int = DEFAULT_HASH_BLOCKS
                 ) -> None:
        self._bound = bound
        self._depth = depth
        self._nodes: dict[str, float] = {}
        self._ring = HashRing(())

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        chain = cycle.chain
        if chain is None:
            return [0.0] * len(candidates)
        weights = {c.spec.id: c.spec.weight for c in cycle.pool}
        if weights != self._nodes:
            self._nodes, self._ring = weights, HashRing(weights)
        inflight = {c.spec.id: c.inflight for c in cycle.pool}
        pick = self._ring.pick(chain.key(self._depth), inflight, bound=self._bound)
        return [1.0 if c.spec.id == pick else 0.0 for c in candidates]
