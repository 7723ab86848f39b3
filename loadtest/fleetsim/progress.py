"""`kvgate simulate` on a terminal: an estimate of its run time, then a progress bar.

The work is counted in simulated requests: every run (a load level x a seed x a contender)
replays the same schedule, about the offered rate x the duration requests (a trace: its requests
in the window). Before anything has run, the time is that count times `PER_REQUEST_S`, each
contender's wall cost of one simulated request as measured on a 2-core host, divided by the
processes (`--jobs`). Once runs have ended, the measured cost of those replaces it, so the
remaining time follows the host at hand.

`simulation_progress` is the one entry point: a context manager yielding the callback
`run_experiment` reports to (loadtest/fleetsim/experiment.py), which takes its lines: the
capacity once measured, then one line per run ended with its requests and its wall time. The bar
advances by the requests of each run ended; the lines themselves are printed above it. Piped, or
without rich (the `top` and `dev` extras), the lines are printed as they come, the estimate among
them as soon as it is known, and nothing else.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from loadtest.fleetsim.experiment import Contender, Experiment

if TYPE_CHECKING:
    from rich.progress import ProgressColumn, Task

Progress = Callable[[str], None]

# Seconds of wall time per simulated request, by contender, measured with
#   kvgate simulate --duration 120
# (the default fleet of 8 backends, load 0.85, seed 0; 6,701 requests a run) on a loaded 2-core
# host. A policy that lets the fleet fall behind costs more a request: more of them in flight at
# every step. A policy not measured here is costed as the dearest.
PER_REQUEST_S = {"round_robin": 0.0063, "random": 0.0049, "least_request": 0.0035,
                 "power_of_two": 0.0031, "kv_util": 0.0029, "prefix_hash": 0.0019,
                 "cost+adm": 0.0027}
UNMEASURED_S = max(PER_REQUEST_S.values())

_CAPACITY = re.compile(r"^capacity: ([0-9.]+) requests/s$")
_RUN_ENDED = re.compile(r": (\d+) requests in ([0-9.]+) s$")


def runs_per_contender(experiment: Experiment) -> int:
    levels = len(experiment.loads) or len(experiment.rates) or 1
    return levels * len(experiment.seeds)


def requests_per_run(experiment: Experiment, capacity: float | None) -> list[float]:
    """The simulated requests of one run at each load level (the schedule's expected count)."""
    if experiment.trace is not None:
        span = experiment.duration_s
        n = sum(1 for item in experiment.trace if span is None or item.arrival_s < span)
        return [float(n)] * (len(experiment.loads) or len(experiment.rates) or 1)
    duration = experiment.duration_s or 0.0
    if experiment.loads:
        if capacity is None:
            return []
        return [load * capacity * duration for load in experiment.loads]
    return [rate * duration for rate in experiment.rates]


def estimate_s(experiment: Experiment, capacity: float | None, jobs: int) -> float | None:
    """The whole run's wall time at the measured cost per request; None before the capacity a
    load level needs is known."""
    per_run = requests_per_run(experiment, capacity)
    if not per_run:
        return None
    seeds = len(experiment.seeds)
    work = sum(per_run) * seeds * sum(_cost(c) for c in experiment.contenders)
    return work / max(1, min(jobs, len(per_run) * seeds * len(experiment.contenders)))


def _cost(contender: Contender) -> float:
    return PER_REQUEST_S.get(contender.label, UNMEASURED_S)


def planned_requests(experiment: Experiment, capacity: float | None) -> int:
    per_run = requests_per_run(experiment, capacity)
    return round(sum(per_run) * len(experiment.seeds) * len(experiment.contenders))


def describe_estimate(experiment: Experiment, capacity: float | None, jobs: int) -> str | None:
    seconds = estimate_s(experiment, capacity, jobs)
    if seconds is None:
        return None
    policies, seeds = len(experiment.contenders), len(experiment.seeds)
    levels = runs_per_contender(experiment) // seeds
    requests = planned_requests(experiment, capacity)
    return (f"estimate: about {_duration(seconds)} for {requests:,} simulated requests "
            f"({_count(policies, 'policy', 'policies')} x {_count(seeds, 'seed', 'seeds')} x "
            f"{_count(levels, 'load level', 'load levels')})")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


class Bar:
    """The estimate and the bar, fed `run_experiment`'s lines; `now` is injectable for tests."""

    def __init__(self, experiment: Experiment, jobs: int, stream: TextIO,
                 now: Callable[[], float] = time.monotonic) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.experiment, self.jobs, self._now = experiment, jobs, now
        self.capacity: float | None = None
        self.requests_done = 0
        self.wall_done = 0.0
        self.deadline: float | None = None
        self.console = Console(file=stream, highlight=False)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            _counts_column(), TimeElapsedColumn(), _left_column(self), console=self.console)
        self.task = self.progress.add_task("simulating", total=None)
        self._plan()

    def __call__(self, line: str) -> None:
        self.progress.console.print(line)
        if (m := _CAPACITY.match(line)) is not None:
            self.capacity = float(m.group(1))
            self._plan()
        elif (m := _RUN_ENDED.search(line)) is not None:
            self.requests_done += int(m.group(1))
            self.wall_done += float(m.group(2))
            total = max(self.requests_done, planned_requests(self.experiment, self.capacity))
            self.progress.update(self.task, completed=self.requests_done, total=total)
            if self.requests_done:
                per_request = self.wall_done / self.requests_done
                left = (total - self.requests_done) * per_request / self._processes()
                self.deadline = self._now() + left

    def _processes(self) -> int:
        runs = runs_per_contender(self.experiment) * len(self.experiment.contenders)
        return max(1, min(self.jobs, runs))

    def _plan(self) -> None:
        text = describe_estimate(self.experiment, self.capacity, self.jobs)
        if text is None:
            self.progress.update(self.task, description="measuring the fleet's capacity")
            return
        self.progress.console.print(text)
        seconds = estimate_s(self.experiment, self.capacity, self.jobs)
        assert seconds is not None
        self.deadline = self._now() + seconds
        self.progress.update(self.task, description="simulating",
                             total=planned_requests(self.experiment, self.capacity))

    def finish(self) -> None:
        """Every run has ended: the bar full at the requests simulated (the schedules' own
        count, which the estimate's expected one only approached)."""
        self.progress.update(self.task, total=self.requests_done, completed=self.requests_done)
        self.deadline = None  # nothing left to show

    def left(self) -> str:
        """The time still to go, as the bar shows it."""
        if self.deadline is None:
            return ""
        return f"about {_duration(max(0.0, self.deadline - self._now()))} left"


class Lines:
    """The plain lines, with the estimate once it is known (at once for a rate or a trace, after
    the capacity's line for a load level)."""

    def __init__(self, experiment: Experiment, jobs: int, stream: TextIO) -> None:
        self.experiment, self.jobs, self.stream = experiment, jobs, stream
        self.estimated = False
        self._estimate(None)

    def __call__(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
        if not self.estimated and (m := _CAPACITY.match(line)) is not None:
            self._estimate(float(m.group(1)))

    def _estimate(self, capacity: float | None) -> None:
        text = describe_estimate(self.experiment, capacity, self.jobs)
        if text is not None:
            print(text, file=self.stream, flush=True)
            self.estimated = True


def _counts_column() -> ProgressColumn:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Counts(ProgressColumn):
        def render(self, task: Task) -> Text:
            total = "" if task.total is None else f" of {task.total:,.0f}"
            return Text(f"{task.completed:,.0f}{total} requests")

    return Counts()


def _left_column(bar: Bar) -> ProgressColumn:
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Left(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(bar.left())

    return Left()


@contextmanager
def simulation_progress(experiment: Experiment, *, jobs: int, quiet: bool, bar: bool,
                        stream: TextIO | None = None) -> Iterator[Progress | None]:
    """The callback for `run_experiment`: None with `quiet`; the estimate and the bar with `bar`
    (a terminal, the table on stdout); else the lines, one by one."""
    out = stream if stream is not None else sys.stderr
    bar = bar and importlib.util.find_spec("rich") is not None  # the `top` and `dev` extras
    if quiet:
        yield None
        return
    if not bar:
        yield Lines(experiment, jobs, out)
        return
    shown = Bar(experiment, jobs, out)
    with shown.progress:
        yield shown
        shown.finish()
