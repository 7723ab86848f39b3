"""The Dispatcher's learning hooks: what it learns after a dispatch, at a first token and when an
attempt ends. The policy's own hooks (routing/policy.py `DispatchHook`) run beside these.

- `PrefixLearner`: the prefix index learns the request's chain against its backend at dispatch
  (the backend will hold it from its first token on).
- `SessionTable`: a session's last backend, LRU-bounded.
- `WorkLearner`: each backend's `BackendWork` records what was sent there (its uncached prompt,
  at the backend's learned prefill speed) and what ended.
- `SpeedLearner`: each backend's speed (`ProfileEstimator`) from the attempt's first token and
  from the reply's TPOT (`Completion.decode_tpot`), against the prediction it was dispatched on,
  pooled with the other backends of its class (routing/speed_pool.py): the class is read from
  the candidate each dispatch went to, and every member's scale is settled again whenever one of
  them learns or the class's membership changes.
- `CostLearner`: the cost model's prompt calibration and output-length distribution, from the
  usage the backend reported.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from routing.cost import CostModel
from routing.jobs import Completion, Dispatch
from routing.prefix import PrefixIndex
from routing.scheduling.backends import BackendModels
from routing.speed_pool import SpeedClasses, between_variance, class_log_scale, speed_class
from routing.state import Candidate


class Learner(Protocol):
    def dispatched(self, dispatch: Dispatch, uncached_tokens: int, now: float) -> None: ...
    def first_token(self, dispatch: Dispatch, now: float) -> None: ...
    def finished(self, dispatch: Dispatch, completion: Completion | None) -> None: ...


class Moments:
    """A learner's three moments, each learning nothing unless the learner overrides it."""

    def dispatched(self, dispatch: Dispatch, uncached_tokens: int, now: float) -> None:
        """The request went to `dispatch.backend_id` at `now`."""

    def first_token(self, dispatch: Dispatch, now: float) -> None:
        """The attempt's first token arrived at `now`."""

    def finished(self, dispatch: Dispatch, completion: Completion | None) -> None:
        """The attempt ended; `completion` is what the backend reported, if it ended whole."""


Hooks = tuple[Callable[..., None], ...]


def moment_hooks(learners: tuple[Learner, ...]) -> tuple[Hooks, Hooks, Hooks]:
    """The learners' bound methods for each moment (dispatched, first_token, finished), in
    learner order, leaving out the moments a learner inherits empty from `Moments` (calling one
    costs a call and learns nothing)."""
    def hooks(moment: str) -> Hooks:
        empty: Any = getattr(Moments, moment)
        return tuple(getattr(learner, moment) for learner in learners
                     if getattr(type(learner), moment, None) is not empty)
    return hooks("dispatched"), hooks("first_token"), hooks("finished")


class PrefixLearner(Moments):
    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def dispatched(self, dispatch: Dispatch, uncached_tokens: int, now: float) -> None:
        if dispatch.chain.blocks:
            self.index.record(dispatch.backend_id, dispatch.chain)


class SessionTable(Moments):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("the session table needs room for one session")
        self._capacity = capacity
        self._last: OrderedDict[str, str] = OrderedDict()

    def backend_of(self, session: str | None) -> str | None:
        return None if session is None else self._last.get(session)

    def dispatched(self, dispatch: Dispatch, uncached_tokens: int, now: float) -> None:
        session = dispatch.job.session
        if session is not None:
            self._last[session] = dispatch.backend_id
            self._last.move_to_end(session)
            if len(self._last) > self._capacity:
                self._last.popitem(last=False)


class WorkLearner(Moments):
    def __init__(self, models: BackendModels) -> None:
        self._models = models

    def dispatched(self, dispatch: Dispatch, uncached_tokens: int, now: float) -> None:
        state = self._models.state(dispatch.backend_id)
        state.work.dispatched(now, uncached_tokens, dispatch.context_tokens,
                              state.profile.prefill_tokens_per_s)


    def finished(self, dispatch: Dispatch, completion: Completion | None) -> None:
        self._models.work_of(dispatch.backend_id).finished(dispatch.context_tokens)


class SpeedLearner(Moments):
    """Speeds pooled by class. A class's pooled estimate is published to all its members when
    it has moved by more than `REPUBLISH_LOG` since it last was (or the membership changed);
    in between, only the member that learned takes it up: one reply then costs one member's
    update, not the class's, and alike members still read one value."""

    REPUBLISH_LOG = 0.01  # about 1%

    def __init__(self, models: BackendModels) -> None:
        self._models = models
        self._classes = SpeedClasses()
        self._seen: dict[str, Candidate] = {}  # the candidate view each backend was classed from
        self._published: dict[Hashable, float] = {}  # each class's pooled log scale, as read

    def dispatched(self, dispatch: Dispatch, uncached_tokens: int, now: float) -> None:
        candidate = dispatch.decision.backend
        backend = candidate.id
        if self._seen.get(backend) is candidate:
            return
        self._seen[backend] = candidate
        changed, left = self._classes.assign(backend, speed_class(candidate))
        if changed:
            # A member with no readings of its own moves no pool: it only takes its class's.
            measured = self._models.state(backend).estimator.reading.readings > 0
            self._settle(backend, everyone=measured)
            if left is not None and measured:
                self._settle_class(left, self._classes.members(left), None)

    def first_token(self, dispatch: Dispatch, now: float) -> None:
        pred = dispatch.prediction
        if pred is not None:
            backend = dispatch.backend_id
            self._models.state(backend).estimator.observe_ttft(pred, now - dispatch.dispatched_at)
            self._settle(backend)

    def finished(self, dispatch: Dispatch, completion: Completion | None) -> None:
        pred = dispatch.prediction
        if completion is None or pred is None:
            return
        tpot = completion.decode_tpot(pred.predicted_ttft_s)
        if tpot is not None and tpot > 0.0:
            # Past the first few, TTFTs are not learned from: they include queueing.
            backend = dispatch.backend_id
            state = self._models.state(backend)
            state.estimator.observe_tpot(pred.kv_read_tokens, pred.prefill_tokens_per_s, tpot)
            self._settle(backend)
            self._models.replies[backend] = state.estimator.replies

    def _settle(self, backend: str, *, everyone: bool = False) -> None:
        key = self._classes.class_of(backend)
        self._settle_class(key, self._classes.siblings(backend), None if everyone else backend)

    def _settle_class(self, key: Hashable, members: tuple[str, ...], learner: str | None) -> None:
        """Pool the members' own estimates; give the new scale to `learner` alone while the
        pooled estimate stays within `REPUBLISH_LOG` of the published one, else (or with no
        `learner`) to every member."""
        states = [self._models.state(m) for m in members]
        if len(states) == 1:
            states[0].estimator.pool_with(None)
            states[0].learned()
            return
        readings = [s.estimator.reading for s in states]
        params = states[0].estimator.params
        pooled, tau2 = class_log_scale(readings, params), between_variance(readings)
        published = self._published.get(key)
        if learner is not None and published is not None and (
                abs(pooled - published) <= self.REPUBLISH_LOG):
            state = self._models.state(learner)
            state.estimator.pool_with(published, tau2)
            state.learned()
            return
        self._published[key] = pooled
        for s in states:
            s.estimator.pool_with(pooled, tau2)
            s.learned()


class CostLearner(Moments):
    def __init__(self, cost_model: CostModel) -> None:
        self._cost_model = cost_model


    def finished(self, dispatch: Dispatch, completion: Completion | None) -> None:
        if completion is None:
            return
        calibrate = dispatch.job.prompt_tokens is None  # token-id prompts have no characters
        self._cost_model.observe(
            dispatch.cost,
            prompt_tokens=completion.prompt_tokens if calibrate else None,
            completion_tokens=completion.completion_tokens,
            finish_reason=completion.finish_reason,
        )
