"""Routing policies: filters → scorers → picker, composed by a `Router`.

A policy is a `Router` built from three kinds of small, pure plugins:
- `Filter.filter(request, candidates) -> list[Candidate]` drops backends that must not get the
  request (unhealthy, wrong model, out of KV blocks...).
- `Scorer.score(request, candidate) -> float` rates one backend in [0, 1], higher is better. Scorers
  need not clamp: the Router clamps every score to [0, 1] (NaN counts as 0) and applies the weights,
  so no plugin can dominate by returning a large number.
- `Picker.pick(scored) -> Candidate` chooses among the scored survivors.

Policies are selected by name from `POLICIES`, the one registry, in routing/policies.py (with the
plugins beyond this framework in routing/scorers.py); callers ask
`build_router(name, PolicyContext(...))` and call the returned Router, never branching on a
policy's name or class. Randomness comes only from the injected `random.Random`. Nothing here
reads a clock or does I/O; pickers' cursors and scorers' per-decision caches are the only state.
A decision's cross-candidate facts (predicted TTFTs, prefix matches, load ranges) travel on
`RouteRequest.context`, built once per decision by routing/context.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

from routing.context import RouteContext
from routing.state import Candidate


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy may know about a request when it decides."""

    model: str
    prompt_tokens: int = 0  # estimated from the body; 0 when unknown
    max_tokens: int | None = None
    stream: bool = False
    context: RouteContext | None = None  # per-decision facts; None when routed without them


class Scored(NamedTuple):
    """One candidate's score. A named tuple: one is made per candidate of every decision, and a
    tuple is built faster than a frozen dataclass."""

    candidate: Candidate
    score: float  # the weighted sum of clamped scores: in [0, sum of weights]


@dataclass(frozen=True, slots=True)
class Decision:
    backend: Candidate
    policy: str
    reason: str  # one human-readable line: why this backend

    @property
    def backend_id(self) -> str:
        return self.backend.id


class NoCandidate(Exception):
    """No backend survived the filters; `reason` says which step emptied the list."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Filter(Protocol):
    def filter(self, request: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]: ...


class Scorer(Protocol):
    def score(self, request: RouteRequest, candidate: Candidate) -> float: ...


class Picker(Protocol):
    def pick(self, scored: Sequence[Scored]) -> Candidate: ...


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float = 1.0


class Router:
    """One policy: applies its filters in order, scores the survivors, and asks its picker."""

    def __init__(
        self,
        name: str,
        *,
        picker: Picker,
        filters: Sequence[Filter] = (),
        scorers: Sequence[Weighted] = (),
    ) -> None:
        if any(w.weight < 0 for w in scorers):
            raise ValueError("scorer weights must be >= 0")
        self.name = name
        self._filters = tuple(filters)
        self._scorers = tuple(scorers)
        # (bound score method, weight) pairs: `_score` runs for every candidate of every decision.
        self._score_fns = tuple((w.scorer.score, w.weight) for w in self._scorers)
        self._picker = picker

    def route(self, request: RouteRequest, candidates: Sequence[Candidate]) -> Decision:
        """The chosen backend; raises NoCandidate when no candidate survives the filters."""
        survivors = list(candidates)
        if not survivors:
            raise NoCandidate(f"no healthy backend serves {request.model!r}")
        for step in self._filters:
            survivors = step.filter(request, survivors)
            if not survivors:
                raise NoCandidate(f"{type(step).__name__} left no backend for {request.model!r}")
        scored = [Scored(c, self._score(request, c)) for c in survivors]
        chosen = self._picker.pick(scored)
        score = next(s.score for s in scored if s.candidate is chosen)
        reason = f"{chosen.id} scored {score:.3f}, best of {len(scored)} of {len(candidates)}"
        return Decision(backend=chosen, policy=self.name, reason=reason)

    def _score(self, request: RouteRequest, candidate: Candidate) -> float:
        total = 0.0
        for score, weight in self._score_fns:
            value = score(request, candidate)
            if not value >= 0.0:  # negative or NaN
                value = 0.0
            elif value > 1.0:
                value = 1.0
            total += weight * value
        return total


class HealthyFilter:
    """Only backends currently marked healthy."""

    def filter(self, request: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        return [c for c in candidates if c.healthy]


class RoundRobinPicker:
    """Rotates through the best-scored candidates in id order.

    The cursor starts at a random offset (from the injected Random) so that several gateway
    replicas started together do not all send their first requests to the same backend.
    """

    def __init__(self, rng: random.Random) -> None:
        self._cursor = rng.randrange(1 << 30)

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        best = max(s.score for s in scored)
        ties = sorted((s.candidate for s in scored if s.score == best), key=lambda c: c.id)
        chosen = ties[self._cursor % len(ties)]
        self._cursor += 1
        return chosen


class MaxScorePicker:
    """The highest score; ties broken uniformly at random."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        best = max(s.score for s in scored)
        ties = [s.candidate for s in scored if s.score == best]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy factory may use to build its Router."""

    rng: random.Random = field(default_factory=random.Random)
    # Scorer weights by scorer name, overriding the policy's defaults; a name the policy does not
    # use is an error (routing/policies.py names each policy's scorers).
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    prefix_load_bound: float = 1.25  # bounded-load factor for prefix affinity and hashing
    # cost: long prompts to slower backends within the SLOs (routing/offload.py).
    offload_long_prompts: bool = True
    hash_prefix_blocks: int = 4  # prefix blocks that form prefix_hash's ring key


PolicyFactory = Callable[[PolicyContext], Router]


def policy_names() -> tuple[str, ...]:
    """Every registered policy (the registry lives in routing/policies.py)."""
    from routing.policies import POLICIES  # deferred: policies.py builds on this module

    return tuple(sorted(POLICIES))


def build_router(name: str, ctx: PolicyContext) -> Router:
    """A fresh Router for the policy `name`; ValueError naming the known ones otherwise."""
    from routing.policies import POLICIES  # deferred: policies.py builds on this module

    try:
        factory = POLICIES[name]
    except KeyError as exc:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}") from exc
    return factory(ctx)
