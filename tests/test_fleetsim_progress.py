"""`kvgate simulate`'s estimate and progress bar: the estimate is the simulated requests times
each policy's measured cost a request, the bar counts the requests of every run as the
experiment reports it, and piped or quiet runs get the plain lines or nothing."""

from __future__ import annotations

import io

import pytest

from gateway.cli import build_parser
from loadtest.fleetsim.experiment import Experiment, run_experiment
from loadtest.fleetsim.progress import (
    PER_REQUEST_S,
    UNMEASURED_S,
    Bar,
    describe_estimate,
    estimate_s,
    planned_requests,
    simulation_progress,
)
from loadtest.simulate_cli import build_experiment


def experiment_of(*flags: str) -> Experiment:
    return build_experiment(build_parser().parse_args(["simulate", *flags]))


def test_the_estimate_is_requests_times_each_policys_cost() -> None:
    experiment = experiment_of("--policies", "round_robin,cost", "--rate", "10,20",
                               "--duration", "100", "--seeds", "0,1")
    assert planned_requests(experiment, None) == (10 + 20) * 100 * 2 * 2
    expected = (10 + 20) * 100 * 2 * (PER_REQUEST_S["round_robin"] + PER_REQUEST_S["cost+adm"])
    assert estimate_s(experiment, None, jobs=1) == pytest.approx(expected)
    # Processes divide it, never more of them than there are runs (2 rates x 2 seeds x 2).
    assert estimate_s(experiment, None, jobs=4) == pytest.approx(expected / 4)
    assert estimate_s(experiment, None, jobs=64) == pytest.approx(expected / 8)
    text = describe_estimate(experiment, None, jobs=1)
    assert text is not None and "12,000 simulated requests" in text
    assert "2 policies x 2 seeds x 2 load levels" in text


def test_a_load_level_is_estimated_once_the_capacity_is_known() -> None:
    experiment = experiment_of("--policies", "cost", "--admission", "none", "--load", "0.5",
                               "--duration", "60")
    assert estimate_s(experiment, None, jobs=1) is None
    assert planned_requests(experiment, 40.0) == 0.5 * 40 * 60
    assert estimate_s(experiment, 40.0, jobs=1) == pytest.approx(0.5 * 40 * 60 * UNMEASURED_S)


def test_the_bar_counts_every_request_the_experiment_simulates() -> None:
    experiment = experiment_of("--backends", "2", "--policies", "round_robin,cost",
                               "--rate", "6", "--duration", "3", "--seeds", "0,1")
    stream = io.StringIO()
    bar = Bar(experiment, jobs=1, stream=stream)
    with bar.progress:
        report = run_experiment(experiment, bar)
        bar.finish()
    simulated = sum(len(run.outcome.requests) for point in report.points for run in point.runs)
    assert simulated > 0 and bar.requests_done == simulated
    [task] = bar.progress.tasks
    assert task.completed == task.total == simulated and bar.left() == ""
    shown = stream.getvalue()
    assert "estimate: about" in shown and "round_robin: " in shown  # the lines, above the bar


def test_the_time_left_follows_the_measured_pace() -> None:
    experiment = experiment_of("--policies", "cost", "--rate", "10", "--duration", "100",
                               "--seeds", "0,1")
    clock = [1000.0]
    bar = Bar(experiment, jobs=1, stream=io.StringIO(), now=lambda: clock[0])
    assert bar.left() == f"about {round(2000 * PER_REQUEST_S['cost+adm'])} s left"
    bar("load 10.00 req/s seed 0 cost+adm: 1000 requests in 40.0 s")  # 40 ms a request
    assert bar.left() == "about 40 s left"
    clock[0] += 30
    assert bar.left() == "about 10 s left"


def test_quiet_runs_get_nothing_and_piped_ones_the_plain_lines_with_the_estimate() -> None:
    experiment = experiment_of("--rate", "1", "--duration", "1")
    with simulation_progress(experiment, jobs=1, quiet=True, bar=True) as progress:
        assert progress is None
    out = io.StringIO()
    with simulation_progress(experiment, jobs=1, quiet=False, bar=False, stream=out) as progress:
        assert progress is not None
        progress("load 1.00 req/s seed 0 cost+adm: 1 requests in 0.1 s")
    estimate = describe_estimate(experiment, None, jobs=1)
    assert out.getvalue() == f"{estimate}\nload 1.00 req/s seed 0 cost+adm: 1 requests in 0.1 s\n"


def test_piped_a_load_level_is_estimated_after_the_capacity_line() -> None:
    experiment = experiment_of("--policies", "cost", "--load", "0.5", "--duration", "60")
    out = io.StringIO()
    with simulation_progress(experiment, jobs=1, quiet=False, bar=False, stream=out) as progress:
        assert progress is not None and out.getvalue() == ""
        progress("capacity: 40.00 requests/s")
        progress("capacity: 40.00 requests/s")
    assert out.getvalue().splitlines() == [
        "capacity: 40.00 requests/s", describe_estimate(experiment, 40.0, jobs=1),
        "capacity: 40.00 requests/s"]
