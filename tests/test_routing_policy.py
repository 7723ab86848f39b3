"""Routing: filters → scorers → picker composed by a Router, and the round_robin policy. Scorers
score the whole list; only the Router clamps and weights."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Mapping

import pytest

from routing.policies import PolicyContext, build_router, policy_names
from routing.policy import Decision, NoCandidate, Router, Weighted
from routing.scheduling.cycle import CycleState
from routing.scheduling.filters import HealthyFilter
from routing.scheduling.pickers import MaxScorePicker, RoundRobinPicker
from routing.state import BackendSpec, Candidate
from tests.test_routing_scorers import cost

REQUEST = CycleState("m", cost())


def cand(backend_id: str, *, healthy: bool = True) -> Candidate:
    return Candidate(
        spec=BackendSpec(id=backend_id, url=f"http://127.0.0.1/{backend_id}", models=("m",)),
        healthy=healthy,
        snapshot=None,
        stale=True,
        inflight=0,
        reserved_blocks=0,
    )


class TableScorer:
    """Scores from a table by backend id."""

    def __init__(self, table: Mapping[str, float]) -> None:
        self.table = table

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        return [self.table[c.id] for c in candidates]


class DropAll:
    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        return []


def round_robin(seed: int = 0) -> Router:
    return build_router("round_robin", PolicyContext(rng=random.Random(seed)))


def test_round_robin_is_registered_by_name() -> None:
    assert "round_robin" in policy_names()
    assert round_robin().name == "round_robin"


def test_unknown_policy_name_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="round_robin"):
        build_router("least_busy_typo", PolicyContext())


def test_round_robin_visits_every_candidate_once_per_cycle() -> None:
    router = round_robin(seed=7)
    candidates = [cand("b2"), cand("b0"), cand("b1")]
    picks = [router.route(REQUEST, candidates).backend_id for _ in range(9)]
    for cycle in range(3):
        assert sorted(picks[cycle * 3 : cycle * 3 + 3]) == ["b0", "b1", "b2"]
    # Rotation follows id order, whatever order the candidates come in.
    start = ["b0", "b1", "b2"].index(picks[0])
    assert picks[:3] == [["b0", "b1", "b2"][(start + i) % 3] for i in range(3)]


def test_round_robin_skips_unhealthy_candidates() -> None:
    router = round_robin()
    candidates = [cand("b0"), cand("b1", healthy=False), cand("b2")]
    picks = {router.route(REQUEST, candidates).backend_id for _ in range(10)}
    assert picks == {"b0", "b2"}


def test_round_robin_with_the_same_seed_repeats_the_same_sequence() -> None:
    candidates = [cand(f"b{i}") for i in range(5)]
    first, again = round_robin(seed=3), round_robin(seed=3)
    assert [first.route(REQUEST, candidates).backend_id for _ in range(10)] == [
        again.route(REQUEST, candidates).backend_id for _ in range(10)
    ]


def test_the_starting_backend_depends_on_the_injected_random() -> None:
    candidates = [cand(f"b{i}") for i in range(8)]
    starts = {round_robin(seed=s).route(REQUEST, candidates).backend_id for s in range(40)}
    assert len(starts) > 1


@pytest.mark.parametrize(
    "candidates",
    [
        pytest.param([], id="no candidates at all"),
        pytest.param([cand("b0", healthy=False)], id="only unhealthy candidates"),
    ],
)
def test_no_survivor_raises_no_candidate(candidates: list[Candidate]) -> None:
    with pytest.raises(NoCandidate):
        round_robin().route(REQUEST, candidates)


def test_no_candidate_names_the_filter_that_emptied_the_list() -> None:
    router = Router("p", filters=(DropAll(),), picker=RoundRobinPicker(random.Random(0)))
    with pytest.raises(NoCandidate, match="DropAll"):
        router.route(REQUEST, [cand("b0")])


def test_decision_names_backend_policy_and_reason() -> None:
    decision = round_robin().route(REQUEST, [cand("b0")])
    assert isinstance(decision, Decision)
    assert (decision.backend_id, decision.policy) == ("b0", "round_robin")
    assert "b0" in decision.reason


def max_score_router(*scorers: Weighted) -> Router:
    return Router("test", scorers=scorers, picker=MaxScorePicker(random.Random(0)))


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        pytest.param(
            {"b0": 100.0, "b1": 1.0}, {"b0": 0.0, "b1": 0.5}, "b1",
            id="a score above 1 counts as 1 so one scorer cannot dominate",
        ),
        pytest.param(
            {"b0": -50.0, "b1": 0.0}, {"b0": 0.2, "b1": 0.1}, "b0",
            id="a negative score counts as 0",
        ),
        pytest.param(
            {"b0": math.nan, "b1": 0.3}, {"b0": 0.2, "b1": 0.0}, "b1",
            id="NaN counts as 0",
        ),
    ],
)
def test_router_clamps_scores_to_unit_interval(
    first: dict[str, float], second: dict[str, float], expected: str
) -> None:
    router = max_score_router(Weighted(TableScorer(first)), Weighted(TableScorer(second)))
    assert router.route(REQUEST, [cand("b0"), cand("b1")]).backend_id == expected


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        pytest.param((1.0, 0.0), "b0", id="weight 0 silences a scorer"),
        pytest.param((1.0, 3.0), "b1", id="a heavier scorer outweighs a lighter one"),
    ],
)
def test_router_weights_scores(weights: tuple[float, float], expected: str) -> None:
    likes_b0 = TableScorer({"b0": 1.0, "b1": 0.0})
    likes_b1 = TableScorer({"b0": 0.0, "b1": 0.5})
    router = max_score_router(Weighted(likes_b0, weights[0]), Weighted(likes_b1, weights[1]))
    assert router.route(REQUEST, [cand("b0"), cand("b1")]).backend_id == expected


def test_negative_weight_is_rejected() -> None:
    with pytest.raises(ValueError, match="weights"):
        max_score_router(Weighted(TableScorer({}), -1.0))


def test_max_score_picker_breaks_ties_with_the_injected_random() -> None:
    tied = TableScorer({"b0": 0.5, "b1": 0.5, "b2": 0.1})
    candidates = [cand("b0"), cand("b1"), cand("b2")]

    def picks(seed: int) -> list[str]:
        router = Router(
            "t", scorers=(Weighted(tied),), picker=MaxScorePicker(random.Random(seed))
        )
        return [router.route(REQUEST, candidates).backend_id for _ in range(200)]

    counts = Counter(picks(1))
    assert set(counts) == {"b0", "b1"}  # never the lower score
    assert min(counts.values()) > 50  # both tied backends get a fair share
    assert picks(1) == picks(1)  # and the sequence is a function of the seed


def test_round_robin_picker_rotates_only_among_the_best_scored() -> None:
    scores = TableScorer({"b0": 0.9, "b1": 0.9, "b2": 0.2})
    router = Router("t", scorers=(Weighted(scores),), picker=RoundRobinPicker(random.Random(0)))
    picks = [router.route(REQUEST, [cand("b0"), cand("b1"), cand("b2")]).backend_id
             for _ in range(6)]
    assert set(picks) == {"b0", "b1"}
    assert all(a != b for a, b in zip(picks, picks[1:], strict=False))


def test_healthy_filter_keeps_only_healthy_candidates() -> None:
    kept = HealthyFilter().filter(REQUEST, [cand("b0"), cand("b1", healthy=False)])
    assert [c.id for c in kept] == ["b0"]
