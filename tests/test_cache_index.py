"""`SemanticIndex` finds what a brute-force cosine scan finds: the most similar member at or above
the threshold, the higher rank on a tie; removed members are gone from every dimension."""

from __future__ import annotations

import random

import pytest

from gateway.cache.index import SemanticIndex
from gateway.cache.vectors import Vector, cosine, normalised

A: Vector = {1: 1.0}
B: Vector = normalised({1: 1.0, 2: 1.0})  # cosine(A, B) = 0.707
C: Vector = {3: 1.0}  # shares nothing with A or B


def index_of(**members: tuple[Vector, float]) -> SemanticIndex:
    index = SemanticIndex()
    for id, (vector, rank) in members.items():
        index.add(id, vector, rank)
    return index


@pytest.mark.parametrize(
    ("members", "query", "threshold", "expected"),
    [
        pytest.param({"a": (A, 1), "b": (B, 2)}, A, 0.5, ("a", 1.0), id="the most similar wins"),
        pytest.param({"a": (A, 1), "b": (B, 2)}, A, 1.01, None, id="nothing at the threshold"),
        pytest.param({"a": (A, 1), "b": (A, 2)}, A, 0.5, ("b", 1.0),
                     id="a tie goes to the higher rank"),
        pytest.param({"c": (C, 1)}, A, 0.1, None, id="a member sharing no dimension never matches"),
        pytest.param({"c": (C, 1)}, A, 0.0, ("c", 0.0), id="unless the threshold is zero or less"),
        pytest.param({"x": ({}, 1)}, A, -1.0, None, id="an empty vector never matches"),
    ],
)
def test_best(members: dict[str, tuple[Vector, float]], query: Vector, threshold: float,
              expected: tuple[str, float] | None) -> None:
    found = index_of(**members).best(query, threshold)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found[0] == expected[0]
        assert found[1] == pytest.approx(expected[1])


def test_a_discarded_member_is_gone_and_a_replaced_one_has_its_new_vector() -> None:
    index = index_of(a=(A, 1), b=(B, 2))
    index.discard("a")
    index.discard("never there")
    assert "a" not in index and len(index) == 1
    found = index.best(A, 0.5)
    assert found is not None and found[0] == "b"
    index.add("b", C, 3)
    assert index.best(A, 0.1) is None
    assert index.best(C, 0.9) == ("b", pytest.approx(1.0))


def test_skip_leaves_members_out() -> None:
    index = index_of(a=(A, 1), b=(B, 2))
    found = index.best(A, 0.5, skip=lambda id: id == "a")
    assert found is not None and found[0] == "b"


@pytest.mark.parametrize("threshold", [0.3, 0.7, 0.9, 0.97])
def test_it_agrees_with_a_brute_force_scan_on_random_sparse_vectors(threshold: float) -> None:
    rng = random.Random(7)

    def vector() -> Vector:
        return normalised({rng.randrange(64): rng.random() for _ in range(rng.randint(1, 12))})

    def near(base: Vector) -> Vector:  # a member nudged: above most thresholds
        nudged = {d: v * rng.uniform(0.8, 1.2) for d, v in base.items()}
        nudged[rng.randrange(64)] = rng.random() * 0.3
        return normalised(nudged)

    members = {f"m{i}": (vector(), float(i)) for i in range(200)}
    index = index_of(**members)
    queries = [vector() for _ in range(50)] + [near(members[f"m{i}"][0]) for i in range(50)]
    for query in queries:
        scores = {id: cosine(query, v) for id, (v, _) in members.items()}
        best = max(scores, key=lambda id: (round(scores[id], 12), members[id][1]))
        found = index.best(query, threshold)
        if scores[best] < threshold - 1e-9:
            assert found is None
        elif scores[best] >= threshold + 1e-9:
            assert found is not None
            assert found[1] == pytest.approx(scores[best])
            assert scores[found[0]] == pytest.approx(scores[best])
