"""The real-time driver: runs the pure engine against the wall clock and hands tokens to requests.

One task per server loops while the engine has work: `step()`, wait until the step's end on the
simulated GPU (its duration divided by the time scale), then deliver the step's tokens. Waits are
scheduled against a running deadline, not as a fresh sleep after each step's own compute, so
Python's per-step cost does not add up as drift. When idle the task waits on an event that
`submit` sets.

Latencies are observed here, at delivery, in simulated seconds (real elapsed x time scale), so the
histograms describe the modeled GPU whatever the time scale.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from loadtest.sim.engine import Engine, SimRequest, TokenEvent
from loadtest.sim.exposition import LatencyRecorder

# How far (real seconds) the driver may fall behind its deadline and still catch up by running
# steps back to back; beyond it (a GC pause, a stopped debugger, a saturated CPU) the schedule
# restarts from now instead of replaying the backlog as a burst.
MAX_LAG_S = 0.25

log = logging.getLogger(__name__)


class EngineFailed(RuntimeError):
    """The engine raised inside the driver loop; no request can progress any more."""


class LiveRequest:
    """A request between submit and its last token, as its handler and the driver share it."""

    __slots__ = ("request_id", "arrival", "last_token_at", "events", "finished", "failure",
                 "_waiter")

    def __init__(self, request_id: str, arrival: float) -> None:
        self.request_id = request_id
        self.arrival = arrival
        self.last_token_at = arrival
        self.events: list[TokenEvent] = []
        self.finished = False
        self.failure: EngineFailed | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def next_events(self) -> list[TokenEvent]:
        """The tokens delivered since the last call, waiting for at least one.

        Raises EngineFailed when the driver died before this request's last token."""
        if not self.events and self.failure is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if not self.events and self.failure is not None:
            raise self.failure
        events, self.events = self.events, []
        return events

    def notify(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class RealtimeDriver:
    """Owns the engine's clock. `clock` is a monotonic clock in seconds (the loop's by default)."""

    def __init__(self, engine: Engine, recorder: LatencyRecorder, *, time_scale: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.recorder = recorder
        self.time_scale = time_scale
        self._clock = clock
        self._live: dict[str, LiveRequest] = {}
        self._wake = asyncio.Event()
        self.failure: EngineFailed | None = None

    @property
    def live_requests(self) -> int:
        return len(self._live)

    def submit(self, request: SimRequest) -> LiveRequest:
        """Queue `request` in the engine (ValueError if it cannot fit) and track its delivery.

        Raises EngineFailed once the driver loop has died."""
        if self.failure is not None:
            raise self.failure
        self.engine.add(request)
        live = LiveRequest(request.request_id, self._clock())
        self._live[request.request_id] = live
        self._wake.set()
        return live

    def release(self, live: LiveRequest) -> None:
        """The handler is done with `live`. If its last token has not come, abort it in the
        engine at once (the client went away): its blocks are freed and it counts as "abort"."""
        if self._live.pop(live.request_id, None) is not None and not live.finished:
            self.engine.abort(live.request_id)

    async def run(self) -> None:
        """The driver loop; runs until cancelled. If the engine raises, every live request and
        every later submit gets EngineFailed, and the loop ends with it."""
        try:
            await self._loop()
        except Exception as exc:
            log.exception("the simulated engine failed; failing %d live requests",
                          len(self._live))
            failure = EngineFailed(f"simulated engine failed: {exc!r}")
            self.failure = failure
            for live in self._live.values():
                live.failure = failure
                live.notify()
            raise failure from exc

    async def _loop(self) -> None:
        deadline = self._clock()
        while True:
            if not self.engine.has_work():
                self._wake.clear()
                await self._wake.wait()
                deadline = self._clock()
            result = self.engine.step()
            deadline += result.duration / self.time_scale
            now = self._clock()
            if deadline > now:
                await asyncio.sleep(deadline - now)
            else:
                if now - deadline > MAX_LAG_S:
                    deadline = now
                # Behind schedule: still yield, so handlers can flush and new requests arrive.
                await asyncio.sleep(0)
            if result.events:
                self._deliver(result.events, self._clock())

    def _deliver(self, events: tuple[TokenEvent, ...], now: float) -> None:
        scale = self.time_scale
        ttft, itl, e2e = self.recorder.ttft, self.recorder.itl, self.recorder.e2e
        live_map = self._live
        for event in events:
            live = live_map.get(event.request_id)
            if live is None:  # aborted while its step ran
                continue
            if event.token_index == 0:
                ttft.observe((now - live.arrival) * scale)
            else:
                itl.observe((now - live.last_token_at) * scale)
            live.last_token_at = now
            live.events.append(event)
            if event.finish_reason is not None:
                e2e.observe((now - live.arrival) * scale)
                live.finished = True
                del live_map[event.request_id]
            live.notify()
