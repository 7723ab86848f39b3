"""Ejections and Retry-After holds shared by the gateway's worker processes on one host.

`HoldTable` is a table of 64-bit floats in a shared buffer: one row per worker, in it each
backend's `ejected_until` and `held_until` (monotonic seconds, the same clock in every process)
as that worker's Fleet has them. Each worker writes only its own row; `latest` is the latest of
each over every row. A worker that reads a later one than its own adopts it
(`Fleet.adopt_holds`), so a backend one worker ejected or was told to hold off is out for every
worker within one read. Counting failures towards an ejection stays each worker's own.
A fresh segment's zeros read as times long past, as nothing held.
"""

from __future__ import annotations

from routing.shared_rows import WorkerRows

FIELDS = 2
EJECTED, HELD = range(FIELDS)


class HoldTable(WorkerRows):
    """Per worker and backend: (ejected_until, held_until), 64-bit floats."""

    __slots__ = ()
    FIELDS = FIELDS

    @staticmethod
    def _typed(raw: memoryview) -> memoryview[float]:
        return raw.cast("d")

    def write(self, worker: int, backend: int, ejected_until: float, held_until: float) -> None:
        at, cells = self._at(worker, backend), self._cells
        if cells[at + EJECTED] != ejected_until:
            cells[at + EJECTED] = ejected_until
        if cells[at + HELD] != held_until:
            cells[at + HELD] = held_until

    def latest(self, backend: int) -> tuple[float, float]:
        """(ejected_until, held_until): the latest of each over every worker."""
        cells, stride = self._cells, self.backends * FIELDS
        at = backend * FIELDS
        rows = range(self.workers)
        return (max(cells[at + EJECTED + w * stride] for w in rows),
                max(cells[at + HELD + w * stride] for w in rows))

    def release(self) -> None:
        self._cells.release()
