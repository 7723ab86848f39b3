"""One namespace's vectors, searched: the shape both stores hold per namespace, and its makers.

`VectorIndex` is `SemanticIndex`'s contract (gateway/cache/index.py): sparse vectors through an
inverted index, right for the hashing embedder. `DenseVectors` keeps the same contract over a
`DenseIndex` (gateway/cache/dense_index.py), one numpy matrix product per search, right for an
embedding model's vectors, where every member shares every dimension with the query. Entries and
the Redis wire keep every vector in the one `Vector` shape (gateway/cache/vectors.py): a dense
vector is its dimensions 0..n-1, turned into a numpy row here, once per add and per search.

`index_maker(dimensions, dense, max_members)` is what a store is given to make a namespace's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from gateway.cache.index import SemanticIndex
from gateway.cache.vectors import Vector

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from gateway.cache.dense_index import DenseIndex


class VectorIndex(Protocol):
    def __len__(self) -> int: ...
    def __contains__(self, id: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def rank(self, id: str) -> float: ...
    def add(self, id: str, vector: Vector, rank: float) -> None: ...
    def discard(self, id: str) -> None: ...
    def best(self, query: Vector, threshold: float,
             skip: Callable[[str], bool] | None = None) -> tuple[str, float] | None: ...


IndexMaker = Callable[[], VectorIndex]


class DenseVectors:
    """A `DenseIndex` behind the `VectorIndex` contract. `dimensions` 0 (a remote model's, not
    known before its first reply) is learned from the first non-empty vector added. A vector of
    another length (a corrupt one) is kept as a member that never matches."""

    __slots__ = ("_index", "_max_members")

    def __init__(self, dimensions: int, *, max_members: int) -> None:
        self._max_members = max_members
        self._index: DenseIndex | None = None
        if dimensions:
            self._make(dimensions)

    def __len__(self) -> int:
        return len(self._index) if self._index is not None else 0

    def __contains__(self, id: object) -> bool:
        return self._index is not None and id in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index) if self._index is not None else iter(())

    def rank(self, id: str) -> float:
        if self._index is None:
            raise KeyError(id)
        return self._index.rank(id)

    def add(self, id: str, vector: Vector, rank: float) -> None:
        index = self._index if self._index is not None or not vector else self._make(len(vector))
        if index is not None:
            index.add(id, _row(vector, index.dimensions), rank)

    def discard(self, id: str) -> None:
        if self._index is not None:
            self._index.discard(id)

    def best(self, query: Vector, threshold: float,
             skip: Callable[[str], bool] | None = None) -> tuple[str, float] | None:
        if self._index is None:
            return None
        return self._index.best(_row(query, self._index.dimensions), threshold, skip)

    def _make(self, dimensions: int) -> DenseIndex:
        from gateway.cache.dense_index import DenseIndex

        self._index = DenseIndex(dimensions, max_members=self._max_members)
        return self._index


def _row(vector: Vector, dimensions: int) -> npt.NDArray[np.float32]:
    """`vector` as a numpy row of `dimensions`; zeros when its indices do not fit."""
    import numpy as np

    row = np.zeros(dimensions, dtype=np.float32)
    if vector and max(vector) < dimensions and min(vector) >= 0:
        row[list(vector)] = list(vector.values())
    return row


def index_maker(dimensions: int, *, dense: bool, max_members: int) -> IndexMaker:
    """Sparse vectors get a `SemanticIndex`; dense ones a `DenseVectors` of `max_members` rows
    (one more than a namespace indexes, so the store's own trim decides who goes)."""
    if not dense:
        return SemanticIndex
    return lambda: DenseVectors(dimensions, max_members=max_members + 1)
