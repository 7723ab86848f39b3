"""The routing framework: a `Router` (one policy's scheduling profile) runs filters, then
scorers, then one picker over a request's cycle state (routing/scheduling/cycle.py).

- `Filter.filter(cycle, candidates) -> candidates` drops backends that must not get the request.
  Pure: it reads the cycle state and its own configuration, never writes anything.
- `Scorer.score(cycle, candidates) -> scores` rates the whole list at once, one score per
  candidate in [0, 1], higher is better; cross-candidate figures come from the cycle state. The
  Router clamps every score to [0, 1] (NaN counts as 0) and only it applies the weights, so no
  plugin can dominate by returning a large number.
- `Picker.pick(scored) -> Candidate` chooses among the scored survivors.
- `DispatchHook.dispatched(cycle, decision)`: what a policy's plugins learn, after the request
  was dispatched to `decision.backend`. The Dispatcher calls every hook of its Router once per
  dispatch; filters read what their hooks learned, so the learning is outside `filter()`.

Policies are composed by name in routing/policies.py, the one registry; callers build a Router
there and call it, never branching on a policy's name or class. Randomness comes only from an
injected `random.Random`; nothing reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from routing.scheduling.cycle import CycleState
from routing.state import Candidate

_new = tuple.__new__  # builds a named tuple without its Python-level __new__


class Scored(NamedTuple):
    """One candidate's score. A named tuple: one is made per candidate of every decision, and a
    tuple is built faster than a frozen dataclass."""

    candidate: Candidate
    score: float  # the weighted sum of clamped scores: in [0, sum of weights]


class Decision(NamedTuple):
    """A named tuple: one is made per decision, and a tuple is built faster than a frozen
    dataclass."""

    backend: Candidate
    policy: str
    reason: str  # one human-readable line: why this backend
    # The last filter that removed candidates (None: every candidate reached the scorers).
    narrowed_by: object = None

    @property
    def backend_id(self) -> str:
        return self.backend.id


class NoCandidate(Exception):
    """No backend survived the filters; `reason` says which step emptied the list."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Filter(Protocol):
    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]: ...


class Scorer(Protocol):
    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]: ...


class Picker(Protocol):
    def pick(self, scored: Sequence[Scored]) -> Candidate: ...


class DispatchHook(Protocol):
    def dispatched(self, cycle: CycleState, decision: Decision) -> None: ...


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
        hooks: Sequence[DispatchHook] = (),
    ) -> None:
        if any(w.weight < 0 for w in scorers):
            raise ValueError("scorer weights must be >= 0")
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.hooks = tuple(hooks)
        self.picker = picker
        self._score_fns = tuple((w.scorer.score, w.weight) for w in self.scorers)

    def route(self, cycle: CycleState, candidates: Sequence[Candidate]) -> Decision:
        """The chosen backend; raises NoCandidate when no candidate survives the filters."""
        # Filters are pure (a new list, or the one given when they keep all): no copy needed.
        survivors = candidates if isinstance(candidates, list) else list(candidates)
        if not survivors:
            raise NoCandidate(f"no healthy backend serves {cycle.model!r}")
        narrowed_by: object = None
        for step in self.filters:
            before = len(survivors)
            survivors = step.filter(cycle, survivors)
            if not survivors:
                raise NoCandidate(f"{type(step).__name__} left no backend for {cycle.model!r}")
            if len(survivors) != before:
                narrowed_by = step
        totals: list[float] | None = None
        for score_fn, weight in self._score_fns:
            # Each score clamped to [0, 1] (NaN counts as 0), then weighted and summed in scorer
            # order (the first scorer's weighted scores start the sums: 0.0 + x is x); the lengths
            # are checked once per scorer, so the zips need not check them again.
            scores = score_fn(cycle, survivors)
            if len(scores) != len(survivors):
                raise ValueError(f"{score_fn!r} gave {len(scores)} scores for "
                                 f"{len(survivors)} candidates")
            if totals is None:
                totals = [weight * (1.0 if v > 1.0 else v if v >= 0.0 else 0.0) for v in scores]
            else:
                totals = [t + weight * (1.0 if v > 1.0 else v if v >= 0.0 else 0.0)
                          for t, v in zip(totals, scores, strict=False)]
        if totals is None:
            totals = [0.0] * len(survivors)
        scored = [_new(Scored, pair) for pair in zip(survivors, totals, strict=False)]
        chosen = self.picker.pick(scored)
        score = next(t for c, t in zip(survivors, totals, strict=False) if c is chosen)
        reason = f"{chosen.id} scored {score:.3f}, best of {len(scored)} of {len(candidates)}"
        return Decision(backend=chosen, policy=self.name, reason=reason, narrowed_by=narrowed_by)

    def dispatched(self, cycle: CycleState, decision: Decision) -> None:
        """The request went to `decision.backend`: every hook of the policy learns from it."""
        for hook in self.hooks:
            hook.dispatched(cycle, decision)
