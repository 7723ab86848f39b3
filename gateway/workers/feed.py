"""A worker's reader of the host's scrapes: every `interval` (half the poll interval, so a
snapshot reaches the worker at most that much later than the poller took it) it applies the
outcomes the host's poller published since (routing/shared_snapshots.py) to the worker's Fleet,
in place of a poller of its own, and shares the host's ejections and holds
(routing/shared_health.py). A timer callback, as the poller's are: no task per read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from routing import shared_snapshots
from routing.fleet import Fleet
from routing.shared_health import HoldTable
from routing.shared_snapshots import ScrapeBoard


class BoardFeed:
    def __init__(self, fleet: Fleet, board: ScrapeBoard, interval: float,
                 holds: HoldTable | None = None, worker: int = 0,
                 on_error: Callable[[str, str], None] | None = None,
                 on_tick: Callable[[], None] | None = None) -> None:
        """`holds`, `worker`: the host's ejections and holds, and this worker's row there: at
        every read this worker's are published and the other workers' later ones adopted.
        `on_error(backend_id, error_class)`: told of every failed scrape read, as the poller's
        (one worker of the host counts them, or the host's `/metrics` would count each N
        times). `on_tick()`: called at every timed read (the worker's metrics check)."""
        if interval <= 0:
            raise ValueError("need a positive interval")
        self._fleet = fleet
        self._board = board
        self._interval = interval
        self._holds = holds
        self._worker = worker
        self._on_error = on_error
        self._on_tick = on_tick
        self._timer: asyncio.TimerHandle | None = None
        self.applied = 0

    def read(self) -> int:
        """Applies what is new; how many outcomes that was."""
        fresh = self._board.fresh()
        for backend_id, event in fresh:
            shared_snapshots.apply(self._fleet, backend_id, event)
            if event.error and self._on_error is not None:
                self._on_error(backend_id, event.error)
        self.applied += len(fresh)
        if self._holds is not None:
            self.share_holds(self._holds)
        return len(fresh)

    def share_holds(self, holds: HoldTable) -> None:
        fleet, worker = self._fleet, self._worker
        for i, spec in enumerate(fleet.specs):
            health = fleet.health(spec.id)
            holds.write(worker, i, health.ejected_until, health.held_until)
            ejected_until, held_until = holds.latest(i)
            fleet.adopt_holds(spec.id, ejected_until, held_until)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.read()
            if self._on_tick is not None:
                self._on_tick()
        finally:
            self._timer = loop.call_later(self._interval, self._tick)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[BoardFeed]:
        self._tick()
        try:
            yield self
        finally:
            if self._timer is not None:
                self._timer.cancel()

    async def first_round(self, timeout_s: float) -> bool:
        """Waits until every backend has an outcome on the board, at most `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self._board.all_published():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(min(self._interval, 0.01))
        self.read()
        return True
