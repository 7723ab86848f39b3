"""`DenseIndex`: one namespace's dense, normalised vectors in a numpy matrix, searched whole.

The contract is `SemanticIndex`'s (gateway/cache/index.py): `add(id, vector, rank)`, `discard`,
`best(query, threshold, skip)` returning the most similar member at or above the threshold (the
higher rank on a tie, then the greater id), members with an empty (zero) vector kept but never
matched. For an embedding model's vectors, where every member shares every dimension with the
query, an inverted index saves nothing: one matrix-vector product scores every member at once.

A search reads the whole matrix, which at ten thousand rows of 384 floats is 15 MB: more than a
core's caches, so the product waits on memory. Each row is therefore also kept as a code of
`BITS` bits, the signs of its projections on fixed random hyperplanes (SimHash: two vectors at
angle θ differ in each bit with probability θ/π, independently), four 64-bit words a row. A search
first takes the members whose code is within `cutoff(threshold)` bits of the query's (the
expected distance at the threshold plus `SIGMAS` standard deviations: a member at the threshold
is left out with a probability below one in a billion, one nearer less still) and scores only
those exactly; a threshold so low that the cutoff would take a large share of every namespace
scores every row. Either way the scores returned are the exact cosines.

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
import math
from collections.abc import Callable, Iterator

from gateway.cache.embedders.threads import pin_blas_to_one_thread

pin_blas_to_one_thread()

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

INITIAL_ROWS = 64
BITS = 256  # of a row's code
SIGMAS = 6.0  # the cutoff's margin over the expected code distance at the threshold
SCAN_ALL_ABOVE = 0.4  # a cutoff this close to half the bits (random vectors'): score every row
PLANES_SEED = 0x6B76


def cutoff(threshold: float, bits: int = BITS) -> int | None:
    """The most bits a member's code may differ from the query's for it to be scored, or None
    to score every row (a low threshold: the codes would pass most members anyway)."""
    share = math.acos(max(-1.0, min(1.0, threshold))) / math.pi
    limit = bits * share + SIGMAS * math.sqrt(bits * share * (1 - share)) + 1
    return None if limit >= bits * SCAN_ALL_ABOVE else int(limit)


WORDS = BITS // 64  # a code's 64-bit words
_BYTE_BITS = np.array([bin(value).count("1") for value in range(256)], dtype=np.uint16)


def _distances(codes: npt.NDArray[np.uint64], code: npt.NDArray[np.uint64]
               ) -> npt.NDArray[np.uint16]:
    """The number of bits each row of `codes` differs from `code` in (word by word: numpy's
    reductions along a short axis are slow)."""
    differing = np.bitwise_xor(codes, code)
    found: npt.NDArray[np.uint16] = np.zeros(len(codes), dtype=np.uint16)
    for word in range(WORDS):
        column = differing[:, word]
        if hasattr(np, "bitwise_count"):  # numpy 2
            found += np.bitwise_count(column)
        else:
            found += _BYTE_BITS[column.view(np.uint8).reshape(-1, 8)].sum(axis=1,
                                                                          dtype=np.uint16)
    return found


class DenseIndex:
    __slots__ = ("_dimensions", "_max_members", "_matrix", "_ids", "_rows", "_ranks", "_empty",
                 "_by_rank", "_planes", "_codes")

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
        self._planes: npt.NDArray[np.float32] = np.random.default_rng(PLANES_SEED).normal(
            size=(BITS, dimensions)).astype(np.float32)
        self._codes: npt.NDArray[np.uint64] = np.zeros((self._matrix.shape[0], WORDS),
                                                       dtype=np.uint64)

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
        self._codes[row] = self._code(vector)
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
            self._codes[row] = self._codes[last]
            self._ids[row] = moved
            self._rows[moved] = row
        self._ids.pop()

    def best(self, query: npt.NDArray[np.float32], threshold: float,
             skip: Callable[[str], bool] | None = None) -> tuple[str, float] | None:
        """The member most similar to `query` (normalised) at or above `threshold` (the higher
        rank on a tie, then the greater id), leaving out those `skip` names; None when none."""
        if not self._ids or not query.any():
            return None
        query = query.astype(np.float32, copy=False)
        count = len(self._ids)
        limit = cutoff(threshold)
        if limit is None:
            scores = self._matrix[:count] @ query
            rows = np.flatnonzero(scores >= threshold)
            found = scores[rows]
        else:
            near = np.flatnonzero(_distances(self._codes[:count], self._code(query)) <= limit)
            found = self._matrix[near] @ query
            keep = found >= threshold
            rows, found = near[keep], found[keep]
        if rows.size == 0:
            return None
        ranks = self._ranks
        ids = self._ids
        ordered = sorted(((float(score), ranks[ids[row]], ids[row])
                          for row, score in zip(rows.tolist(), found.tolist(), strict=True)),
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

    def _code(self, vector: npt.NDArray[np.float32]) -> npt.NDArray[np.uint64]:
        """The signs of `vector`'s projections on the hyperplanes, packed into 64-bit words."""
        return np.packbits(self._planes @ vector > 0).view(np.uint64)

    def _grow(self) -> None:
        rows = min(self._matrix.shape[0] * 2, self._max_members)
        grown = np.zeros((rows, self._dimensions), dtype=np.float32)
        grown[:len(self._ids)] = self._matrix[:len(self._ids)]
        self._matrix = grown
        codes = np.zeros((rows, WORDS), dtype=np.uint64)
        codes[:len(self._ids)] = self._codes[:len(self._ids)]
        self._codes = codes
