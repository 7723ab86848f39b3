"""What the gateway has learned about each backend, in one record per backend: its speed
(`ProfileEstimator`, routing/speed.py) and the profile it gives, its record of the work sent
there (`BackendWork`, routing/backend_work.py), and the backend's side of the TTFT model
(`BackendLoad`, routing/predict.py) with what it was computed from. The learning hooks
(routing/scheduling/learning.py) write it; the data producer (routing/scheduling/facts.py) reads
it, and reuses a backend's load while the candidate view (a new object whenever its snapshot,
staleness, health or ledger changes), the profile, the work record's version, the time and the
model's figures are the same (and, for a stale backend, its smallest peer's KV capacity it is
read on): a backend's side is computed once per state, not per request.
"""

from __future__ import annotations

import math

from routing.backend_work import BackendWork
from routing.predict import BackendLoad
from routing.speed import ProfileEstimator
from routing.state import Candidate
from routing.ttft import BackendProfile


class BackendState:
    __slots__ = ("estimator", "work", "profile", "calibrated", "load", "load_candidate",
                 "load_version", "load_now", "load_figures", "load_peers")

    def __init__(self, estimator: ProfileEstimator, work: BackendWork) -> None:
        self.estimator = estimator
        self.work = work
        self.profile = estimator.profile()  # kept equal to estimator.profile() (`learned`)
        self.calibrated = estimator.calibrated
        # The cached load (None: to compute) and what it was computed from: the candidate view,
        # the work record's version, the time, and the generation of the model's figures.
        self.load: BackendLoad | None = None
        self.load_candidate: Candidate | None = None
        self.load_version = -1
        self.load_now = math.nan
        self.load_figures = -1
        # A stale backend's load is read on its smallest peer's KV capacity (tokens) as well.
        self.load_peers: int | None = None

    def learned(self) -> None:
        """The estimator learned something: its profile and calibration are read again, and the
        load computed at the old profile is dropped."""
        self.profile = self.estimator.profile()
        self.calibrated = self.estimator.calibrated
        self.load = None


class BackendModels:
    """One per Dispatcher. `prior`: the reference speed; each backend's is learned relative to
    it, starting slow (ttft.SLOW_START_SCALE) until its replies are measured."""

    __slots__ = ("prior", "states", "replies")

    def __init__(self, prior: BackendProfile | None = None) -> None:
        self.prior = prior or BackendProfile()
        self.states: dict[str, BackendState] = {}
        # Replies each backend's speed has been learned from, kept up to date as TPOTs come in
        # (`CycleState.measured`: one mapping for every decision, not one built per decision).
        self.replies: dict[str, int] = {}

    def state(self, backend_id: str) -> BackendState:
        state = self.states.get(backend_id)
        if state is None:
            state = self.states[backend_id] = BackendState(ProfileEstimator(self.prior),
                                                            BackendWork())
        return state

    def estimator(self, backend_id: str) -> ProfileEstimator:
        return self.state(backend_id).estimator

    def work_of(self, backend_id: str) -> BackendWork:
        return self.state(backend_id).work
