"""The gateway's own count of what it has sent to one backend, and the lease that keeps it honest.

A `Ledger` holds one entry per in-flight request: when it was dispatched and the KV blocks the
gateway expects it to hold, as a `Hold` (routing/kv_hold.py: its own reservation, its expected
blocks and the spread of its reply; a bare block count is a hold with no spread). What the
requests hold together is pooled from the sums of their holds: their expected blocks plus a
margin that grows with the square root of their count (and covers any one of them running to
its own reservation), never more than the sum of their own reservations. The sums are kept
incrementally, so reading them is O(1); "what was dispatched after time t" walks back from the
newest entry and stops at the first older one, so it costs only the requests dispatched since t
(callers pass monotonic times, so entries are in dispatch order).

A `Lease` is the only way in: entering it (`with` or `async with`) is the dispatch, leaving it
is the completion, on every path, exceptions and cancellation included, exactly once.
`set_blocks` adjusts the reservation in between (the Dispatcher's `grow`, when a streaming reply
outgrows what was reserved for it: from then on it holds its new reservation outright).
"""

from __future__ import annotations

import itertools
from types import TracebackType

from routing.kv_hold import Hold, KVPool, check, exact, pooled


class _Entry:
    __slots__ = ("dispatched_at", "hold")

    def __init__(self, dispatched_at: float, hold: Hold) -> None:
        self.dispatched_at = dispatched_at
        self.hold = hold


class Ledger:
    __slots__ = ("_entries", "_pool", "_tickets", "_version")

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}  # by ticket, in dispatch order
        self._pool = KVPool()
        self._tickets = itertools.count()
        self._version = 0

    @property
    def inflight(self) -> int:
        return len(self._entries)

    @property
    def reserved_blocks(self) -> int:
        """What the requests in flight hold together (module docstring)."""
        return self._pool.held

    @property
    def version(self) -> int:
        """Counts the changes (open, resize, close): every figure read from the ledger holds
        until it moves, so a reader may keep what it derived from them until then."""
        return self._version

    def open(self, now: float, hold: Hold | int) -> int:
        """Records a dispatch; returns the ticket that `resize` and `close` take."""
        hold = _hold(hold)
        ticket = next(self._tickets)
        self._entries[ticket] = _Entry(now, hold)
        self._pool.add(hold)
        self._version += 1
        return ticket

    def resize(self, ticket: int, hold: Hold | int) -> None:
        hold = _hold(hold)
        entry = self._entries[ticket]
        self._pool.remove(entry.hold)
        self._pool.add(hold)
        entry.hold = hold
        self._version += 1

    def close(self, ticket: int) -> None:
        self._pool.remove(self._entries.pop(ticket).hold)
        self._version += 1

    def since(self, t: float) -> tuple[int, int]:
        """(requests, blocks they hold together) dispatched at or after `t` and still in
        flight."""
        requests = own = base = spread2 = top = 0
        for entry in reversed(self._entries.values()):
            if entry.dispatched_at < t:
                break
            requests += 1
            o, b, s = entry.hold
            own += o
            base += b
            spread2 += s
            if o - b > top:
                top = o - b
        return requests, pooled(own, base, spread2, top)


class Lease:
    """One request's place in a backend's ledger. Enter = dispatch, exit = done."""

    __slots__ = ("_ledger", "_hold", "_now", "_ticket", "_state")

    def __init__(self, ledger: Ledger, hold: Hold | int, now: float) -> None:
        self._ledger = ledger
        self._hold = _hold(hold)
        self._now = now
        self._ticket = -1
        self._state = "new"  # -> "held" -> "released"

    @property
    def blocks(self) -> int:
        """The request's own reservation."""
        return self._hold.own

    @property
    def hold(self) -> Hold:
        return self._hold

    @property
    def held(self) -> bool:
        return self._state == "held"

    def acquire(self) -> Lease:
        if self._state != "new":
            raise RuntimeError(f"a lease is entered once; this one is {self._state}")
        self._ticket = self._ledger.open(self._now, self._hold)
        self._state = "held"
        return self

    def release(self) -> None:
        """Ends the request's hold; a no-op when already released (or never acquired)."""
        if self._state == "held":
            self._ledger.close(self._ticket)
        self._state = "released"

    def set_blocks(self, blocks: int) -> None:
        """From now on the request holds exactly `blocks`."""
        hold = _hold(blocks)
        if self._state == "held":
            self._ledger.resize(self._ticket, hold)
        if self._state != "released":
            self._hold = hold

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


def _hold(hold: Hold | int) -> Hold:
    return check(exact(hold) if isinstance(hold, int) else hold)
