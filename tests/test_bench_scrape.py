"""The scrape benchmark's backends answer what its docstring says: busy ones move their load at
every answer, idle ones only their process CPU, and a `name[]` query gets only those samples,
which read as the whole answer does."""

from __future__ import annotations

import pytest

from loadtest.bench_scrape import CYCLE, Exposition
from routing.metrics import parse_metrics
from routing.metrics.query import HOT_NAMES, SAMPLE_NAMES


def sample_names(payload: bytes) -> set[str]:
    lines = payload.decode().splitlines()
    return {line.split("{")[0].split(" ")[0] for line in lines if line and line[0] != "#"}


@pytest.mark.parametrize(("workload", "names", "moves"), [
    pytest.param("busy", SAMPLE_NAMES["vllm"], True, id="busy, every name: moves"),
    pytest.param("busy", HOT_NAMES["vllm"], True, id="busy, hot names: moves"),
    pytest.param("idle", SAMPLE_NAMES["vllm"], False, id="idle, every name: the same bytes"),
    pytest.param("idle", None, True, id="idle, plain /metrics: the process CPU moves"),
])
def test_answers_move_as_their_workload_says(
    workload: str, names: tuple[str, ...] | None, moves: bool
) -> None:
    answers = Exposition().answers(workload, names)
    assert len(answers) == CYCLE
    assert (len(set(answers)) > 1) is moves


@pytest.mark.parametrize("workload", ["busy", "idle"])
def test_a_filtered_answer_holds_only_the_names_asked_for_and_reads_as_the_whole(
    workload: str,
) -> None:
    exposition = Exposition()
    names = SAMPLE_NAMES["vllm"]
    whole, filtered = exposition.answers(workload, None), exposition.answers(workload, names)
    for step in (0, 1, CYCLE - 1):
        assert sample_names(filtered[step]) <= set(names)
        assert parse_metrics(filtered[step], taken_at=0.0) == parse_metrics(
            whole[step], taken_at=0.0)
