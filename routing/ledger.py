"""The gateway's own count of what it has sent to one backend, and the lease that keeps it honest.

A `Ledger` holds one entry per in-flight request: when it was dispatched and the KV blocks the
gateway expects it to hold (prompt plus expected output, from the cost estimate when there is one,
else the prompt alone). The totals are kept incrementally, so reading them is O(1); "what was
dispatched after time t" walks back from the newest entry and stops at the first older one, so it
costs only the requests dispatched since t (callers pass monotonic times, so entries are in
dispatch order).

A `Lease` is the only way in: entering it (`with` or `async with`) is the dispatch, leaving it
is the completion, on every path, exceptions and cancellation included, exactly once.
`set_blocks` adjusts the reservation in between (the Dispatcher's `grow`, when a streaming reply
outgrows what was reserved for it).
"""

from __future__ import annotations

import itertools
from types import TracebackType


class _Entry:
    __slots__ = ("dispatched_at", "blocks")

    def __init__(self, dispatched_at: float, blocks: int) -> None:
        self.dispatched_at = dispatched_at
        self.blocks = blocks


class Ledger:
    __slots__ = ("_entries", "_reserved", "_tickets", "_version")

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}  # by ticket, in dispatch order
        self._reserved = 0
        self._tickets = itertools.count()
        self._version = 0

    @property
    def inflight(self) -> int:
        return len(self._entries)

    @property
    def reserved_blocks(self) -> int:
        return self._reserved

    @property
    def version(self) -> int:
        """Counts the changes (open, resize, close): every figure read from the ledger holds
        until it moves, so a reader may keep what it derived from them until then."""
        return self._version

    def open(self, now: float, blocks: int) -> int:
        """Records a dispatch; returns the ticket that `resize` and `close` take."""
        _check_blocks(blocks)
        ticket = next(self._tickets)
        self._entries[ticket] = _Entry(now, blocks)
        self._reserved += blocks
        self._version += 1
        return ticket

    def resize(self, ticket: int, blocks: int) -> None:
        _check_blocks(blocks)
        entry = self._entries[ticket]
        self._reserved += blocks - entry.blocks
        entry.blocks = blocks
        self._version += 1

    def close(self, ticket: int) -> None:
        self._reserved -= self._entries.pop(ticket).blocks
        self._version += 1

    def since(self, t: float) -> tuple[int, int]:
        """(requests, blocks) dispatched at or after `t` and still in flight."""
        requests = blocks = 0
        for entry in reversed(self._entries.values()):
            if entry.dispatched_at < t:
                break
            requests += 1
            blocks += entry.blocks
        return requests, blocks


class Lease:
    """One request's place in a backend's ledger. Enter = dispatch, exit = done."""

    __slots__ = ("_ledger", "_blocks", "_now", "_ticket", "_state")

    def __init__(self, ledger: Ledger, blocks: int, now: float) -> None:
        _check_blocks(blocks)
        self._ledger = ledger
        self._blocks = blocks
        self._now = now
        self._ticket = -1
        self._state = "new"  # -> "held" -> "released"

    @property
    def blocks(self) -> int:
        return self._blocks

    @property
    def held(self) -> bool:
        return self._state == "held"

    def acquire(self) -> Lease:
        if self._state != "new":
            raise RuntimeError(f"a lease is entered once; this one is {self._state}")
        self._ticket = self._ledger.open(self._now, self._blocks)
        self._state = "held"
        return self

    def release(self) -> None:
        """Ends the request's hold; a no-op when already released (or never acquired)."""
        if self._state == "held":
            self._ledger.close(self._ticket)
        self._state = "released"

    def set_blocks(self, blocks: int) -> None:
        _check_blocks(blocks)
        if self._state == "held":
            self._ledger.resize(self._ticket, blocks)
        if self._state != "released":
            self._blocks = blocks

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> Lease:
        return self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _check_blocks(blocks: int) -> None:
    if blocks < 0:
        raise ValueError(f"a reservation cannot be negative: {blocks}")
