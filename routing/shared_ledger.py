"""The in-flight ledger shared by the gateway's worker processes on one host.

`LedgerTable` is a table of 64-bit integers in a shared buffer: one row per worker, in it one
cell group per backend (changes so far, requests in flight, the three sums of their KV holds
(own reservations, expected blocks, squared margins) and the largest excess of one's own
reservation over its expected blocks; routing/kv_hold.py). Each worker writes only its own row;
a reader sums the columns over every row (the largest excess: the largest of the rows) and
pools them, so the host's requests are pooled together as one worker's are. An aligned 8-byte
store is never seen half-done, so each cell is always a value some write left, and the sums are
the host's in-flight requests and reservations within the instant it takes to read them.

`HostLedger` is one backend's `Ledger` in one worker: its entries stay local (what a worker
dispatched since a scrape is its own), every change is published to the worker's row, and its
`inflight`, `reserved_blocks` and `version` read the host's totals, so the Fleet and every policy
see the requests of all workers at once (`Fleet.share_ledgers`).

A worker that died leaves its row as it was; the supervisor clears it (`clear_row`) before the
worker's successor starts, keeping the change count going up.
"""

from __future__ import annotations

from routing.kv_hold import Hold, pooled
from routing.ledger import Ledger
from routing.shared_rows import WorkerRows

FIELDS = 6
VERSION, INFLIGHT, OWN, BASE, SPREAD2, TOP = range(FIELDS)


class LedgerTable(WorkerRows):
    """`workers` rows of `backends` cell groups in `buf` from `offset` (8-byte aligned)."""

    __slots__ = ()
    FIELDS = FIELDS

    @staticmethod
    def _typed(raw: memoryview) -> memoryview[int]:
        return raw.cast("q")

    def write(self, worker: int, backend: int, version: int, inflight: int,
              held: Hold, top: int) -> None:
        """The worker's figures for the backend (`held`: the sums of its requests' holds, `top`
        their largest excess); the version last, so a reader that sees it moved sees the figures
        that moved it."""
        at, cells = self._at(worker, backend), self._cells
        cells[at + INFLIGHT] = inflight
        cells[at + OWN], cells[at + BASE], cells[at + SPREAD2] = held
        cells[at + TOP] = top
        cells[at + VERSION] = version

    def row(self, worker: int, backend: int) -> tuple[int, int, Hold, int]:
        """(version, inflight, the sums of the holds, their top) as the worker last wrote
        them."""
        at, cells = self._at(worker, backend), self._cells
        return (cells[at + VERSION], cells[at + INFLIGHT],
                Hold(cells[at + OWN], cells[at + BASE], cells[at + SPREAD2]), cells[at + TOP])

    def total(self, backend: int, field: int) -> int:
        """The column `field` summed over every worker."""
        cells, stride = self._cells, self.backends * FIELDS
        at = backend * FIELDS + field
        return sum(cells[at + w * stride] for w in range(self.workers))

    def largest(self, backend: int, field: int) -> int:
        """The column `field`'s largest value over every worker."""
        cells, stride = self._cells, self.backends * FIELDS
        at = backend * FIELDS + field
        return int(max(cells[at + w * stride] for w in range(self.workers)))

    def clear_row(self, worker: int) -> None:
        """A dead worker's requests are gone: its in-flight figures read 0 from now on, its
        versions moved on (so readers notice)."""
        for backend in range(self.backends):
            version = self.row(worker, backend)[0]
            self.write(worker, backend, version + 1, 0, Hold(0, 0, 0), 0)

    def release(self) -> None:
        """Drops the view of the buffer (a shared segment cannot close while one is held)."""
        self._cells.release()


class HostLedger(Ledger):
    """One backend's ledger in one worker, its totals the host's (module docstring)."""

    __slots__ = ("_table", "_worker", "_backend", "_base")

    def __init__(self, table: LedgerTable, worker: int, backend: int) -> None:
        super().__init__()
        self._table = table
        self._worker = worker
        self._backend = backend
        self._base = table.row(worker, backend)[0] + 1  # a successor's versions go on rising
        self._publish()

    def _publish(self) -> None:
        pool = self._pool
        self._table.write(self._worker, self._backend, self._base + self._version,
                          len(self._entries), Hold(pool.own, pool.base, pool.spread2), pool.top)

    @property
    def inflight(self) -> int:
        return self._table.total(self._backend, INFLIGHT)

    @property
    def reserved_blocks(self) -> int:
        table, backend = self._table, self._backend
        return pooled(table.total(backend, OWN), table.total(backend, BASE),
                      table.total(backend, SPREAD2), table.largest(backend, TOP))

    @property
    def version(self) -> int:
        return self._table.total(self._backend, VERSION)

    @property
    def local_inflight(self) -> int:
        """This worker's own requests in flight there."""
        return len(self._entries)

    def open(self, now: float, hold: Hold | int) -> int:
        ticket = super().open(now, hold)
        self._publish()
        return ticket

    def resize(self, ticket: int, hold: Hold | int) -> None:
        super().resize(ticket, hold)
        self._publish()

    def close(self, ticket: int) -> None:
        super().close(ticket)
        self._publish()
