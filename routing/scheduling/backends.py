"""What the gateway has learned about each backend, in one place: its speed (`ProfileEstimator`,
routing/speed.py), its record of the work sent there (`BackendWork`, routing/backend_work.py),
the replies its speed rests on, and the prefill-side figures of the TTFT model cached per state
(`LoadCache`, routing/predict.py). The learning hooks (routing/scheduling/learning.py) write it;
the data producer (routing/scheduling/facts.py) reads it.
"""

from __future__ import annotations

from routing.backend_work import BackendWork
from routing.predict import LoadCache
from routing.speed import ProfileEstimator
from routing.ttft import BackendProfile


class BackendModels:
    """One per Dispatcher. `prior`: the reference speed; each backend's is learned relative to
    it, starting slow (ttft.SLOW_START_SCALE) until its replies are measured."""

    __slots__ = ("prior", "estimators", "work", "replies", "loads")

    def __init__(self, prior: BackendProfile | None = None) -> None:
        self.prior = prior or BackendProfile()
        self.estimators: dict[str, ProfileEstimator] = {}
        self.work: dict[str, BackendWork] = {}
        # Replies each backend's speed has been learned from, kept up to date as TPOTs come in
        # (`CycleState.measured`: one mapping for every decision, not one built per decision).
        self.replies: dict[str, int] = {}
        self.loads = LoadCache()

    def estimator(self, backend_id: str) -> ProfileEstimator:
        estimator = self.estimators.get(backend_id)
        if estimator is None:
            estimator = self.estimators[backend_id] = ProfileEstimator(self.prior)
        return estimator

    def work_of(self, backend_id: str) -> BackendWork:
        work = self.work.get(backend_id)
        if work is None:
            work = self.work[backend_id] = BackendWork()
        return work
