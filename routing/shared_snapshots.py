"""Scrape outcomes published once per host and read by every worker process.

One poller per host scrapes each backend; each outcome goes into that backend's slot
(routing/shared_slots.py), and every worker applies the outcomes it has not seen yet to its own
Fleet, exactly as its own poller would have reported them. An outcome is one of

- `ok`: a snapshot (its `taken_at` on the host's monotonic clock, the same in every process);
- `failed`: a scrape that failed, and whether the backend answered at all;
- `unreachable`: a refused connection.

Only the latest outcome per backend is kept: a worker that reads less often than the poller
scrapes skips the ones in between, as a reader of a newer snapshot would.
"""

from __future__ import annotations

import marshal
from collections.abc import Sequence
from dataclasses import dataclass

from routing.fleet import Fleet
from routing.shared_slots import Slots
from routing.state import BackendSnapshot

OK, FAILED, UNREACHABLE = "ok", "failed", "unreachable"
SLOT_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ScrapeEvent:
    kind: str  # OK, FAILED or UNREACHABLE
    at: float  # monotonic seconds
    answered: bool = False  # FAILED: the backend answered (an error status, a bad payload)
    snapshot: BackendSnapshot | None = None  # OK
    error: str = ""  # FAILED, UNREACHABLE: the error's class name, as the poller's on_error


def encode(event: ScrapeEvent) -> bytes:
    snap = None if event.snapshot is None else tuple(event.snapshot)
    return marshal.dumps((event.kind, event.at, event.answered, snap, event.error))


def decode(payload: bytes) -> ScrapeEvent:
    kind, at, answered, snap, error = marshal.loads(payload)
    snapshot = None if snap is None else BackendSnapshot(*snap)
    return ScrapeEvent(str(kind), float(at), bool(answered), snapshot, str(error))


def apply(fleet: Fleet, backend_id: str, event: ScrapeEvent) -> None:
    """Reports `event` into `fleet` as the poller reports a scrape's outcome."""
    if event.kind == OK:
        assert event.snapshot is not None
        fleet.record_scrape(backend_id, event.snapshot)
    elif event.kind == UNREACHABLE:
        fleet.record_unreachable(backend_id, event.at)
    else:
        fleet.record_scrape_failure(backend_id, event.at, answered=event.answered)


class ScrapeBoard:
    """One slot per backend, in configuration order."""

    __slots__ = ("_slots", "_index", "_seen")

    def __init__(self, slots: Slots, backend_ids: Sequence[str]) -> None:
        if slots.count != len(backend_ids):
            raise ValueError("one slot per backend")
        self._slots = slots
        self._index = {backend_id: i for i, backend_id in enumerate(backend_ids)}
        self._seen = [0] * len(backend_ids)

    @staticmethod
    def nbytes(backends: int) -> int:
        return Slots.nbytes(backends, SLOT_BYTES)

    def publish(self, backend_id: str, event: ScrapeEvent) -> None:
        """The poller's side: one writer per host."""
        self._slots.write(self._index[backend_id], encode(event))

    def fresh(self) -> list[tuple[str, ScrapeEvent]]:
        """A reader's side: the outcomes published since this board last returned them."""
        out: list[tuple[str, ScrapeEvent]] = []
        slots, seen = self._slots, self._seen
        for backend_id, i in self._index.items():
            if slots.sequence(i) == seen[i]:
                continue
            got = slots.read(i)
            if got is None:
                continue
            seen[i] = got[0]
            out.append((backend_id, decode(got[1])))
        return out

    def all_published(self) -> bool:
        """Whether every backend has had an outcome published."""
        return all(self._slots.sequence(i) for i in self._index.values())
