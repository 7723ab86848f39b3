"""`DenseIndex` answers as `SemanticIndex` does on the same vectors (the most similar member at
or above the threshold, the higher rank then the greater id on a tie, `skip` honoured, empty
vectors never matched), and keeps its matrix within its bound."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from gateway.cache.dense_index import DenseIndex
from gateway.cache.index import SemanticIndex

Dense = npt.NDArray[np.float32]


def unit(*values: float) -> Dense:
    vector = np.array(values, dtype=np.float32)
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


A, B, C, ZERO = unit(1, 0, 0), unit(1, 1, 0), unit(0, 0, 1), unit(0, 0, 0)


def index_of(**members: tuple[Dense, float]) -> DenseIndex:
    index = DenseIndex(3, max_members=100)
    for id, (vector, rank) in members.items():
        index.add(id, vector, rank)
    return index


@pytest.mark.parametrize(("members", "query", "threshold", "expected"), [
    pytest.param({"a": (A, 1), "b": (B, 2)}, A, 0.5, ("a", 1.0), id="the most similar wins"),
    pytest.param({"a": (A, 1), "b": (B, 2)}, A, 1.01, None, id="nothing at the threshold"),
    pytest.param({"a": (A, 1), "b": (A, 2)}, A, 0.5, ("b", 1.0),
                 id="a tie goes to the higher rank"),
    pytest.param({"a": (A, 1), "b": (A, 1)}, A, 0.5, ("b", 1.0),
                 id="then to the greater id"),
    pytest.param({"c": (C, 1)}, A, 0.1, None, id="an orthogonal member is under any threshold"),
    pytest.param({"c": (C, 1)}, A, 0.0, ("c", 0.0), id="unless the threshold is zero or less"),
    pytest.param({"x": (ZERO, 1)}, A, -1.0, None, id="an empty vector never matches"),
    pytest.param({"a": (A, 1)}, ZERO, -1.0, None, id="an empty query matches nothing"),
])
def test_best(members: dict[str, tuple[Dense, float]], query: Dense, threshold: float,
              expected: tuple[str, float] | None) -> None:
    found = index_of(**members).best(query, threshold)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0] == expected[0]
        assert found[1] == pytest.approx(expected[1], abs=1e-6)


def test_skip_leaves_members_out() -> None:
    index = index_of(a=(A, 1), b=(B, 2))
    assert index.best(A, 0.5, skip=lambda id: id == "a") == ("b", pytest.approx(0.7071, 1e-3))
    assert index.best(A, 0.5, skip=lambda id: True) is None


def test_a_discarded_member_is_gone_and_a_replaced_one_has_its_new_vector() -> None:
    index = index_of(a=(A, 1), b=(B, 2), c=(C, 3), x=(ZERO, 4))
    index.discard("a")
    index.discard("x")
    index.discard("never there")
    assert "a" not in index and "x" not in index and len(index) == 2
    assert set(index) == {"b", "c"}
    found = index.best(A, 0.5)
    assert found is not None and found[0] == "b"  # "c" moved into a's row, b kept its own
    index.add("b", C, 5)
    assert index.best(A, 0.1) is None
    assert index.best(C, 0.9) == ("b", pytest.approx(1.0))
    assert index.rank("b") == 5


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_answers_as_the_sparse_index_on_random_vectors(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dense = DenseIndex(16, max_members=1000)
    sparse = SemanticIndex()
    vectors = rng.normal(size=(300, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for number, vector in enumerate(vectors):
        rank = float(rng.integers(0, 5))
        dense.add(f"m{number}", vector, rank)
        sparse.add(f"m{number}", {i: float(v) for i, v in enumerate(vector)}, rank)
    for number in rng.choice(300, size=60, replace=False):
        dense.discard(f"m{number}")
        sparse.discard(f"m{number}")
    for query in vectors[:50] + 0.3 * rng.normal(size=(50, 16)).astype(np.float32):
        query = (query / np.linalg.norm(query)).astype(np.float32)
        for threshold in (0.3, 0.7, 0.95):
            found = dense.best(query, threshold)
            expected = sparse.best({i: float(v) for i, v in enumerate(query)}, threshold)
            assert (found is None) == (expected is None)
            if found is not None and expected is not None:
                assert found[1] == pytest.approx(expected[1], abs=1e-5)
                if abs(found[1] - expected[1]) < 1e-9:
                    assert found[0] == expected[0]


def test_the_matrix_grows_by_doubling_up_to_its_bound_then_the_lowest_rank_goes() -> None:
    index = DenseIndex(3, max_members=100)
    assert index.capacity == 64
    for number in range(100):
        assert index.add(f"m{number}", A, float(number)) is None
    assert index.capacity == 100 and len(index) == 100
    assert index.add("newest", B, 1000.0) == "m0"
    assert "m0" not in index and len(index) == 100 and index.capacity == 100
    assert index.add("m50", C, 2000.0) is None  # a replacement needs no room
    assert index.add("empty", ZERO, 3000.0) == "m1"  # an empty member takes its place too


def test_a_vector_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        DenseIndex(3, max_members=10).add("a", unit(1, 0), 1.0)
    with pytest.raises(ValueError, match="positive"):
        DenseIndex(3, max_members=0)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_evicted_member_is_always_the_lowest_ranked(seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = DenseIndex(3, max_members=20)
    ranks: dict[str, float] = {}
    for step in range(2000):
        id = f"m{rng.integers(0, 60)}"
        if rng.random() < 0.3:
            index.discard(id)
            ranks.pop(id, None)
            continue
        rank = float(rng.integers(0, 50))
        ranks.pop(id, None)
        expected = (min(ranks, key=lambda member: (ranks[member], member))
                    if len(ranks) >= 20 else None)
        assert index.add(id, A if step % 2 else ZERO, rank) == expected
        if expected is not None:
            del ranks[expected]
        ranks[id] = rank
        assert set(index) == set(ranks)


def test_the_benchmark_runs() -> None:
    from loadtest import bench_embed

    assert bench_embed.main(["--runs", "1", "--lengths", "8", "--sizes", "50", "--lookups", "4",
                             "--sparse-members", "20", "--sparse-lookups", "2",
                             "--no-record"]) == 0


def test_a_low_threshold_scores_every_row_and_a_high_one_reads_the_codes_first() -> None:
    from gateway.cache.dense_index import BITS, cutoff

    assert cutoff(0.5) is None and cutoff(0.0) is None
    found = [cutoff(threshold) for threshold in (0.85, 0.9, 0.95, 1.0)]
    assert all(limit is not None and 0 < limit < BITS // 2 for limit in found)
    assert found == sorted(found, reverse=True)  # the nearer the threshold to 1, the fewer bits


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.85, 0.9, 0.97])
def test_reading_the_codes_first_finds_what_scoring_every_row_finds(threshold: float) -> None:
    generator = np.random.default_rng(7)
    rows = generator.normal(size=(3000, 64)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    index = DenseIndex(64, max_members=3000)
    for number, row in enumerate(rows):
        index.add(f"m{number}", row, float(number))
    for spread in (0.02, 0.1, 0.2, 0.3, 1.0):  # from near copies to unrelated queries
        queries = rows[:40] + spread * generator.normal(size=(40, 64)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        for query in queries:
            scores = rows @ query
            best = int(np.argmax(scores))
            expected = (f"m{best}", float(scores[best])) if scores[best] >= threshold else None
            found = index.best(query, threshold)
            assert (found is None) == (expected is None), (spread, found, expected)
            if found is not None and expected is not None:
                assert found[0] == expected[0] and found[1] == pytest.approx(expected[1],
                                                                              abs=1e-5)
