"""`DenseIndex`: one namespace's dense, normalised vectors in a numpy matrix, searched whole.

The contract is `SemanticIndex`'s (gateway/cache/index.py): `add(id, vector, rank)`, `discard`,
`best(query, threshold, skip)` returning the most similar member at or above the threshold (the
higher rank on a tie, then the greater id), members with an empty (zero) vector kept but never
matched. For an embedding model's vectors, where every member shares every dimension with the
query, an inverted index saves nothing: one matrix-vector product scores every member at once.

The matrix holds one float32 row per member, in place: it grows by doubling up to
`max_members` rows (the memory bound: `max_members * dimensions * 4` bytes), and a discarded
row is filled with the last one, so the live rows stay contiguous. Adding a member to a full
index evicts the member of lowest rank (the oldest) and returns its id, so the owner drops it
from its own records too.

Pure and synchronous: no clock, no I/O. BLAS is pinned to one thread
(gateway/cache/embedders/threads.py), so a search uses one core.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from gateway.cache.embedders.threads import pin_blas_to_one_thread

pin_blas_to_one_thread()

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

INITIAL_ROWS = 64


class DenseIndex:
    __slots__ = ("_dimensions", "_max_members", "_matrix", "_ids", "_rows", "_ranks", "_empty",
                 "_by_rank")

    def __init__(self, dimensions: int, *, max_members: int) -> None:
        if dimensions < 1 or max_members < 1:
            raise ValueError(f"dimensions and max_members must be positive, not {dimensions}"
                             f" and {max_members}")
        self._dimensions = dimensions
        self._max_members = max_members
        self._matrix: npt.NDArray[np.float32] = np.zeros(
            (min(INITIAL_ROWS, max_members), dimensions), dtype=np.float32)
        self._ids: list[str] = []  # row -> id, for the live rows
        self._rows: dict[str, int] = {}  # id -> row
        self._ranks: dict[str, float] = {}  # every member's, the empty ones' too
        self._empty: set[str] = set()  # members with a zero vector: never matched
        self._by_rank: list[tuple[float, str]] = []  # a heap, with stale entries: see _lowest

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def capacity(self) -> int:
        """Rows allocated now (at most `max_members`)."""
        return int(self._matrix.shape[0])

    def __len__(self) -> int:
        return len(self._ranks)

    def __contains__(self, id: object) -> bool:
        return id in self._ranks

    def __iter__(self) -> Iterator[str]:
        return iter(self._ranks)

    def rank(self, id: str) -> float:
        return self._ranks[id]

    def add(self, id: str, vector: npt.NDArray[np.float32], rank: float) -> str | None:
        """Adds or replaces `id` with a normalised `vector` (all zeros: a member that never
        matches). Returns the id evicted to make room, or None."""
        if vector.shape != (self._dimensions,):
            raise ValueError(f"a vector of shape {vector.shape}, expected ({self._dimensions},)")
        self.discard(id)
        evicted = None
        if len(self._ranks) >= self._max_members:
            evicted = self._lowest()
            self.discard(evicted)
        self._ranks[id] = rank
        heapq.heappush(self._by_rank, (rank, id))
        if len(self._by_rank) > 2 * len(self._ranks) + 64:  # drop the discarded members' entries
            self._by_rank = [(rank, id) for id, rank in self._ranks.items()]
            heapq.heapify(self._by_rank)
        if not vector.any():
            self._empty.add(id)
            return evicted
        row = len(self._ids)
        if row == self._matrix.shape[0]:
            self._grow()
        self._matrix[row] = vector
        self._ids.append(id)
        self._rows[id] = row
        return evicted

    def discard(self, id: str) -> None:
        if self._ranks.pop(id, None) is None:
            return
        if id in self._empty:
            self._empty.discard(id)
            return
        row = self._rows.pop(id)
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._matrix[row] = self._matrix[last]
            self._ids[row] = moved
            self._rows[moved] = row
        self._ids.pop()

    def best(self, query: npt.NDArray[np.float32], threshold: float,
             skip: Callable[[str], bool] | None = None) -> tuple[str, float] | None:
        """The member most similar to `query` (normalised) at or above `threshold` (the higher
        rank on a tie, then the greater id), leaving out those `skip` names; None when none."""
        if not self._ids or not query.any():
            return None
        scores = self._matrix[:len(self._ids)] @ query.astype(np.float32, copy=False)
        rows = np.flatnonzero(scores >= threshold)
        if rows.size == 0:
            return None
        ranks = self._ranks
        ids = self._ids
        ordered = sorted(((float(scores[row]), ranks[ids[row]], ids[row]) for row in rows),
                         reverse=True)
        for score, _, id in ordered:
            if skip is None or not skip(id):
                return id, score
        return None

    def _lowest(self) -> str:
        """The member of lowest rank (the smaller id on a tie), from the heap: an entry whose
        member is gone or has another rank now is stale, and dropped."""
        while True:
            rank, id = self._by_rank[0]
            if self._ranks.get(id) == rank:
                return id
            heapq.heappop(self._by_rank)

    def _grow(self) -> None:
        rows = min(self._matrix.shape[0] * 2, self._max_members)
        grown = np.zeros((rows, self._dimensions), dtype=np.float32)
        grown[:len(self._ids)] = self._matrix[:len(self._ids)]
        self._matrix = grown
