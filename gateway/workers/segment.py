"""The shared-memory segment of one host's workers: the in-flight ledger table
(routing/shared_ledger.py), the ejections and holds (routing/shared_health.py), the metrics
epochs (gateway/workers/metrics.py), then one scrape slot per backend
(routing/shared_snapshots.py).

The supervisor creates it (`Segment.create`) and unlinks it when it exits; workers attach to it
by name (`Segment.attach`).
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import shared_memory

from gateway.workers.metrics import Epochs
from routing.shared_health import HoldTable
from routing.shared_ledger import LedgerTable
from routing.shared_slots import Slots
from routing.shared_snapshots import SLOT_BYTES, ScrapeBoard


@dataclass(frozen=True, slots=True)
class Layout:
    workers: int
    backend_ids: tuple[str, ...]

    @property
    def ledger_bytes(self) -> int:
        return LedgerTable.nbytes(self.workers, len(self.backend_ids))

    @property
    def holds_bytes(self) -> int:
        return HoldTable.nbytes(self.workers, len(self.backend_ids))

    @property
    def epochs_at(self) -> int:
        return self.ledger_bytes + self.holds_bytes

    @property
    def board_at(self) -> int:
        return self.epochs_at + Epochs.nbytes(self.workers)

    @property
    def nbytes(self) -> int:
        return self.board_at + ScrapeBoard.nbytes(len(self.backend_ids))


class Segment:
    def __init__(self, memory: shared_memory.SharedMemory, layout: Layout, *,
                 owner: bool) -> None:
        self.memory = memory
        self.layout = layout
        self.owner = owner
        buf = memory.buf
        assert buf is not None
        count = len(layout.backend_ids)
        self.ledger = LedgerTable(buf, layout.workers, count)
        self.holds = HoldTable(buf, layout.workers, count, offset=layout.ledger_bytes)
        self.epochs = Epochs(buf, layout.workers, offset=layout.epochs_at)
        slots = Slots(buf, count, SLOT_BYTES, offset=layout.board_at)
        self.board = ScrapeBoard(slots, layout.backend_ids)

    @property
    def name(self) -> str:
        return self.memory.name

    @classmethod
    def create(cls, layout: Layout) -> Segment:
        memory = shared_memory.SharedMemory(create=True, size=layout.nbytes)
        assert memory.buf is not None
        memory.buf[: layout.nbytes] = bytes(layout.nbytes)
        return cls(memory, layout, owner=True)

    @classmethod
    def attach(cls, name: str, layout: Layout) -> Segment:
        # A spawned worker shares the supervisor's resource tracker: attaching registers the
        # name there once more (a no-op), and the segment is unlinked by the supervisor alone.
        memory = shared_memory.SharedMemory(name=name)
        return cls(memory, layout, owner=False)

    def close(self) -> None:
        self.ledger.release()
        self.holds.release()
        self.epochs.release()
        self.memory.close()
        if self.owner:
            self.memory.unlink()
