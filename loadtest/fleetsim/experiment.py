"""An experiment: one fleet, one request source, several loads, policies and seeds.

For every (load, seed) the request schedule is generated ONCE and replayed against a fresh fleet
for every policy, so all policies see the identical requests at the identical instants (and the
identical scrape instants). A load is a fraction of the fleet's measured capacity
(loadtest/fleetsim/capacity.py) or an absolute rate. A trace is replayed as recorded, or with its
timeline scaled to the requested rate (loadtest/fleetsim/trace_replay.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import cycle
from typing import Any

from loadtest.fleetsim.backends import FleetSpec
from loadtest.fleetsim.capacity import preset_capacity, workload_requests
from loadtest.fleetsim.loop import RunOutcome, SimConfig, cycle_collector_paused, simulate
from loadtest.fleetsim.results import Slo, Spread, Summary, spread, summarize
from loadtest.fleetsim.trace import TraceInfo
from loadtest.fleetsim.trace_replay import Replay, level_json, plan, replay
from loadtest.workloads import WorkItem, Workload, schedule
from routing.dispatch import DispatchConfig


@dataclass(frozen=True, slots=True)
class Contender:
    """A policy, and whether kvgate's admission control (KV filter and gateway queue) runs with
    it. `label` names it in reports: the policy, plus "+adm" with admission."""

    policy: str
    admission: bool

    @property
    def label(self) -> str:
        return f"{self.policy}+adm" if self.admission else self.policy


@dataclass(frozen=True, slots=True)
class Experiment:
    fleet: FleetSpec
    contenders: tuple[Contender, ...]
    workload: Workload | None = None  # exactly one of workload and trace
    trace: tuple[WorkItem, ...] | None = None
    loads: tuple[float, ...] = ()  # fractions of capacity; or
    rates: tuple[float, ...] = ()  # requests per second
    arrival: str = "poisson"
    burstiness: float = 2.0
    duration_s: float | None = 600.0  # None: a trace's own span
    seeds: tuple[int, ...] = (0,)
    scrape_interval_s: float = 0.25
    max_snapshot_age_s: float = 1.0
    replicas: int = 1
    slo: Slo = field(default_factory=Slo)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    # Scorer weights by policy (routing/policies.py names), overriding that policy's defaults.
    weights: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # cost: long prompts to slower backends (routing/scheduling/offload.py)
    offload_long_prompts: bool = True
    trace_info: TraceInfo | None = None  # what the trace's reader read and skipped

    def trace_replay(self, point: Point) -> Replay | None:
        """How a level replayed the trace (None without a trace)."""
        if self.trace is None:
            return None
        scaled = bool(self.loads or self.rates)
        return plan([i.arrival_s for i in self.trace], self.duration_s,
                    point.rate_rps if scaled else None)

    def __post_init__(self) -> None:
        if (self.workload is None) == (self.trace is None):
            raise ValueError("an experiment needs a workload or a trace, not both")
        if bool(self.loads) == bool(self.rates) and self.workload is not None:
            raise ValueError("give loads or rates (one of them)")
        if self.loads and self.rates:
            raise ValueError("give loads or rates, not both")
        if any(not x > 0 for x in (*self.loads, *self.rates)):
            raise ValueError("loads and rates must be > 0")
        if not self.contenders or not self.seeds:
            raise ValueError("an experiment needs at least one policy and one seed")
        if self.trace is not None and not self.trace:
            raise ValueError("the trace has no requests")


@dataclass(frozen=True, slots=True)
class Run:
    contender: Contender
    seed: int
    summary: Summary
    outcome: RunOutcome
    wall_s: float  # not part of the JSON: it differs between machines and runs


@dataclass(frozen=True, slots=True)
class Point:
    """One load level: the rate offered and every contender's runs (one per seed)."""

    load: float | None  # fraction of capacity, when known
    rate_rps: float
    runs: tuple[Run, ...]

    def runs_of(self, contender: Contender) -> list[Run]:
        return [r for r in self.runs if r.contender == contender]

    def spread_of(self, contender: Contender) -> dict[str, Spread]:
        return spread([r.summary for r in self.runs_of(contender)])


@dataclass(frozen=True, slots=True)
class Report:
    experiment: Experiment
    capacity_rps: float | None  # the fleet's measured capacity (when loads were asked for)
    points: tuple[Point, ...]

    def as_json(self) -> dict[str, Any]:
        """Everything but wall-clock times: the same experiment gives the same document."""
        e = self.experiment
        return {
            "config": {
                "fleet": e.fleet.describe(),
                "model": e.fleet.model,
                "workload": e.workload.name if e.workload is not None else "trace",
                "arrival": e.arrival,
                "burstiness": e.burstiness if e.arrival == "bursty" else None,
                "duration_s": e.duration_s,
                "seeds": list(e.seeds),
                "scrape_interval_s": e.scrape_interval_s,
                "max_snapshot_age_s": e.max_snapshot_age_s,
                "replicas": e.replicas,
                "slo": {"ttft_s": e.slo.ttft_s, "tpot_s": e.slo.tpot_s},
                "queue_timeout_s": e.dispatch.queue_timeout_s,
                "tpot_slo_s": e.dispatch.slo.tpot_s if e.dispatch.slo_admission else None,
                "slo_wait_s": e.dispatch.slo_wait_s,
                "weights": {policy: dict(w) for policy, w in e.weights.items()},
                "offload_long_prompts": e.offload_long_prompts,
                "contenders": [{"label": c.label, "policy": c.policy, "admission": c.admission}
                               for c in e.contenders],
                **({"trace": e.trace_info.as_json()} if e.trace_info is not None else {}),
            },
            "capacity_rps": None if self.capacity_rps is None else round(self.capacity_rps, 3),
            "points": [
                {
                    "load": p.load,
                    "rate_rps": round(p.rate_rps, 3),
                    **_trace_level(e, p),
                    "policies": {
                        c.label: {
                            "spread": {k: s.as_dict() for k, s in p.spread_of(c).items()},
                            "runs": [{"seed": r.seed, **r.summary.as_dict(),
                                      "backends": _backends(r.outcome)}
                                     for r in p.runs_of(c)],
                        }
                        for c in e.contenders
                    },
                }
                for p in self.points
            ],
        }


def _trace_level(e: Experiment, p: Point) -> dict[str, Any]:
    replayed = e.trace_replay(p)
    if e.trace_info is None or replayed is None:
        return {}
    return {"trace_replay": level_json(e.trace_info, replayed)}


def _backends(run: RunOutcome) -> list[dict[str, Any]]:
    return [{"id": b.id, "preset": b.preset, "requests": b.requests,
             "output_tokens": b.output_tokens, "preemptions": b.preemptions,
             "mean_kv_usage": round(b.mean_kv_usage, 4)} for b in run.backends]


Progress = Callable[[str], None]


def measure_capacity(experiment: Experiment, seed: int) -> float:
    """The fleet's capacity for the experiment's requests (each distinct preset measured once)."""
    def requests() -> Iterator[WorkItem]:
        if experiment.trace is not None:
            return cycle(experiment.trace)
        assert experiment.workload is not None
        return workload_requests(experiment.workload, seed)

    per_preset: dict[str, float] = {}
    for preset in experiment.fleet.presets:
        if preset.name not in per_preset:
            with cycle_collector_paused():
                per_preset[preset.name] = preset_capacity(preset, requests)
    return sum(per_preset[p.name] for p in experiment.fleet.presets)


def run_one(experiment: Experiment, rate: float | None, seed: int, contender: Contender
            ) -> Run:
    """One contender's run at one load level and seed (the schedule is regenerated: it is a pure
    function of the experiment, the rate and the seed). The cycle collector is paused
    throughout (`cycle_collector_paused`): resumed between the steps, it would walk the schedule
    and the outcome, a few objects per request, several times over."""
    with cycle_collector_paused():
        items, window = _schedule(experiment, rate, seed)
        config = SimConfig(
            policy=contender.policy, admission=contender.admission,
            scrape_interval_s=experiment.scrape_interval_s,
            max_snapshot_age_s=experiment.max_snapshot_age_s,
            replicas=experiment.replicas, seed=seed, dispatch=experiment.dispatch,
            weights=experiment.weights.get(contender.policy, {}),
            offload_long_prompts=experiment.offload_long_prompts)
        started = time.perf_counter()
        outcome = simulate(items, experiment.fleet, config, duration_s=window)
        wall = time.perf_counter() - started
        return Run(contender, seed, summarize(outcome, experiment.slo), outcome, wall)


def run_experiment(experiment: Experiment, progress: Progress | None = None, *,
                   jobs: int = 1) -> Report:
    """Every (load, seed, contender) run; `jobs` > 1 runs them in that many processes (the
    results do not depend on it)."""
    say = progress or (lambda _: None)
    capacity: float | None = None
    if experiment.loads:
        say(f"measuring the capacity of {experiment.fleet.describe()} ...")
        capacity = measure_capacity(experiment, experiment.seeds[0])
        say(f"capacity: {capacity:.2f} requests/s")
    levels: list[tuple[float | None, float | None]] = (
        [(load, load * capacity) for load in experiment.loads] if capacity is not None
        else [(None, rate) for rate in experiment.rates] or [(None, None)])
    tasks = [(level, seed, contender) for level in levels for seed in experiment.seeds
             for contender in experiment.contenders]

    def report(run: Run, level: tuple[float | None, float | None]) -> Run:
        n = len(run.outcome.requests)
        say(f"load {_level(level[0], n / run.outcome.duration_s)} seed {run.seed} "
            f"{run.contender.label}: {n} requests in {run.wall_s:.1f} s")
        return run

    if jobs <= 1:
        runs = [report(run_one(experiment, lv[1], seed, c), lv) for lv, seed, c in tasks]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_one, experiment, lv[1], seed, c) for lv, seed, c in tasks]
            runs = [report(f.result(), lv) for f, (lv, _, _) in zip(futures, tasks, strict=True)]
    points: list[Point] = []
    for level in levels:
        level_runs = tuple(r for r, (lv, _, _) in zip(runs, tasks, strict=True) if lv == level)
        first = level_runs[0].outcome
        rate = level[1] if level[1] is not None else len(first.requests) / first.duration_s
        points.append(Point(level[0], rate, level_runs))
    return Report(experiment, capacity, tuple(points))


def _level(load: float | None, rate: float) -> str:
    return f"{load:.0%}" if load is not None else f"{rate:.2f} req/s"


def _schedule(experiment: Experiment, rate: float | None, seed: int
              ) -> tuple[tuple[WorkItem, ...], float]:
    if experiment.trace is not None:
        return replay(experiment.trace, experiment.duration_s, rate)
    assert experiment.workload is not None and rate is not None and experiment.duration_s
    items = schedule(experiment.workload, rate=rate, duration_s=experiment.duration_s, seed=seed,
                     arrival=experiment.arrival, burstiness=experiment.burstiness)
    return items, experiment.duration_s
