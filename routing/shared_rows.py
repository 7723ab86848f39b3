"""A table of 8-byte cells in a shared buffer, one row per worker process and in it one group of
`FIELDS` cells per backend: the layout the shared ledger and the shared holds both use. Each
worker writes only its own row; an aligned 8-byte store is never seen half-done."""

from __future__ import annotations

from typing import Any, ClassVar


class WorkerRows:
    """`workers` rows of `backends` cell groups in `buf` from `offset` (8-byte aligned), each
    cell of the type the subclass's `_typed` casts the bytes to."""

    __slots__ = ("_cells", "workers", "backends")
    FIELDS: ClassVar[int]

    def __init__(self, buf: memoryview, workers: int, backends: int, offset: int = 0) -> None:
        if workers < 1 or backends < 0:
            raise ValueError("need workers >= 1 and backends >= 0")
        size = self.nbytes(workers, backends)
        if offset % 8 or offset + size > len(buf):
            raise ValueError("the table does not fit the buffer (or is not 8-byte aligned)")
        self._cells = self._typed(buf[offset : offset + size])
        self.workers = workers
        self.backends = backends

    @staticmethod
    def _typed(raw: memoryview) -> memoryview[Any]:
        raise NotImplementedError

    @classmethod
    def nbytes(cls, workers: int, backends: int) -> int:
        return workers * backends * cls.FIELDS * 8

    def _at(self, worker: int, backend: int) -> int:
        if not (0 <= worker < self.workers and 0 <= backend < self.backends):
            raise IndexError(f"worker {worker}, backend {backend}")
        return (worker * self.backends + backend) * self.FIELDS
