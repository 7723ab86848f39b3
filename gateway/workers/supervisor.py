"""The supervisor of `kvgate serve --workers N`: the process the command runs.

- It creates the host's shared segment (gateway/workers/segment.py) and metrics directory, and
  holds the port: bound with SO_REUSEPORT (not listening), so port 0 becomes one free port all
  workers listen on, and a port taken fails at once.
- It runs the host's one poller, on uvloop, over a Fleet that publishes every scrape's outcome
  to the board (`PublishingFleet`): each backend is scraped once per interval for the host.
- It starts N workers (gateway/workers/worker.py) with the 'spawn' method and says the gateway
  is ready once every worker listens. A worker that exits while the gateway is not stopping is
  restarted, after its ledger row is cleared (its requests died with it); one that keeps dying
  is restarted at most once per `RESTART_BACKOFF_S`.
- SIGTERM (or SIGINT) is passed to every worker, each drains as a lone gateway does
  (gateway/lifecycle.py); the supervisor exits once all have, 0 when every worker exited 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event

from gateway.config import Settings
from gateway.workers import worker
from gateway.workers.segment import Layout, Segment
from routing.fleet import Fleet, OutlierRules
from routing.poller import Poller, full_every_for
from routing.shared_snapshots import FAILED, OK, UNREACHABLE, ScrapeBoard, ScrapeEvent
from routing.state import BackendSnapshot, BackendSpec

log = logging.getLogger("kvgate.workers")

START_TIMEOUT_S = 120.0  # spawning imports the gateway afresh: seconds on a small machine
RESTART_BACKOFF_S = 1.0
WATCH_S = 0.2  # how often it looks for a worker that exited (a signal wakes it at once)
KILL_AFTER_S = 5.0  # past the drain's own deadlines


class PublishingFleet(Fleet):
    """The supervisor's Fleet: every scrape outcome the poller reports goes onto the board. A
    failure is published once the poller's `on_error` (`failed`, which it calls right after)
    has named its class."""

    def __init__(self, specs: tuple[BackendSpec, ...], board: ScrapeBoard, *,
                 max_snapshot_age: float, rules: OutlierRules) -> None:
        super().__init__(specs, max_snapshot_age=max_snapshot_age, rules=rules)
        self._board = board
        self._failing: dict[str, ScrapeEvent] = {}

    def record_scrape(self, backend_id: str, snapshot: BackendSnapshot) -> None:
        super().record_scrape(backend_id, snapshot)
        self._board.publish(backend_id, ScrapeEvent(OK, snapshot.taken_at, True, snapshot))

    def record_scrape_failure(self, backend_id: str, now: float, *, answered: bool) -> None:
        super().record_scrape_failure(backend_id, now, answered=answered)
        self._failing[backend_id] = ScrapeEvent(FAILED, now, answered)

    def record_unreachable(self, backend_id: str, now: float) -> None:
        super().record_unreachable(backend_id, now)
        self._failing[backend_id] = ScrapeEvent(UNREACHABLE, now)

    def failed(self, backend_id: str, error: str) -> None:
        """The poller's `on_error`."""
        event = self._failing.pop(backend_id, None)
        if event is not None:
            self._board.publish(backend_id, replace(event, error=error))


@dataclass(slots=True)
class _Slot:
    index: int
    process: SpawnProcess
    ready: Event
    started: float
    restarts: int = 0


def hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, not listening: the port the workers share."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Supervisor:
    def __init__(self, settings: Settings, workers: int, log_level: str) -> None:
        if workers < 1:
            raise ValueError("need at least one worker")
        self.settings = settings
        self.workers = workers
        self.log_level = log_level
        self._ctx = multiprocessing.get_context("spawn")
        self._slots: list[_Slot] = []
        self._stopping: signal.Signals | None = None
        self._wake = asyncio.Event()
        self.restarts = 0

    async def run(self, on_ready: Callable[[str], None]) -> int:
        settings = self.settings
        specs = settings.backend_specs()
        layout = Layout(self.workers, tuple(spec.id for spec in specs))
        held = hold_port(settings.server.host, settings.server.port)
        port = held.getsockname()[1]
        host_settings = settings.model_copy(update={
            "server": settings.server.model_copy(update={"port": port})})
        segment = Segment.create(layout)
        metrics_dir = tempfile.mkdtemp(prefix="kvgate-metrics-")
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop, sig)
        try:
            poller = self._poller(specs, segment.board)
            async with poller.running():
                args = [worker.WorkerArgs(i, host_settings, segment.name, layout, metrics_dir,
                                          self.log_level) for i in range(self.workers)]
                self._slots = [self._spawn(a) for a in args]
                if not await self._all_ready():
                    if self._stopping is None:
                        log.error("the workers did not all start: stopping")
                        self._stop(signal.SIGTERM)
                else:
                    host = settings.server.host
                    on_ready(f"http://[{host}]:{port}" if ":" in host
                             else f"http://{host}:{port}")
                await self._watch(args, segment)
                return await self._stopped()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for slot in self._slots:
                if slot.process.is_alive():
                    slot.process.kill()
                slot.process.join(1.0)
            held.close()
            with contextlib.suppress(BufferError):
                segment.close()
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def _poller(self, specs: tuple[BackendSpec, ...], board: ScrapeBoard) -> Poller:
        settings = self.settings
        routing, health = settings.routing, settings.health
        fleet = PublishingFleet(
            specs, board, max_snapshot_age=routing.max_snapshot_age_s,
            rules=OutlierRules(consecutive_failures=health.consecutive_failures,
                               base_ejection_s=health.base_ejection_s,
                               max_ejected_fraction=health.max_ejected_fraction))
        return Poller(
            fleet, interval=routing.poll_interval_s, timeout=routing.scrape_timeout_s,
            on_error=fleet.failed,
            group_size=settings.advanced.poll_group_size,
            full_every=full_every_for(settings.advanced.full_scrape_interval_s,
                                      routing.poll_interval_s))

    def _spawn(self, args: worker.WorkerArgs, restarts: int = 0) -> _Slot:
        ready = self._ctx.Event()
        process = self._ctx.Process(target=worker.main, args=(args, ready),
                                    name=f"kvgate-worker-{args.index}")
        process.start()
        return _Slot(args.index, process, ready, time.monotonic(), restarts)

    def _stop(self, sig: signal.Signals) -> None:
        if self._stopping is None:
            self._stopping = sig
            log.info("%s: stopping %d workers", sig.name, len(self._slots))
        for slot in self._slots:
            if slot.process.is_alive() and slot.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.process.pid, sig)
        self._wake.set()

    async def _all_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self._stopping is None:
            if all(slot.ready.is_set() for slot in self._slots):
                return True
            for slot in self._slots:
                if not slot.process.is_alive() and not slot.ready.is_set():
                    log.error("worker %d exited (code %s) before it served", slot.index,
                              slot.process.exitcode)
                    return False
            await self._nap()
        return False

    async def _nap(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WATCH_S):
                await self._wake.wait()
        self._wake.clear()

    async def _watch(self, args: list[worker.WorkerArgs], segment: Segment) -> None:
        """Restarts the workers that exit, until the gateway is stopping."""
        while self._stopping is None:
            for i, slot in enumerate(self._slots):
                if slot.process.is_alive():
                    continue
                if time.monotonic() - slot.started < RESTART_BACKOFF_S:
                    continue  # a crash loop: at most one restart per backoff
                slot.process.join(0)
                log.warning("worker %d exited (code %s): restarting it", slot.index,
                            slot.process.exitcode)
                segment.ledger.clear_row(slot.index)
                self._slots[i] = self._spawn(args[i], slot.restarts + 1)
                self.restarts += 1
            await self._nap()

    async def _stopped(self) -> int:
        """Waits for every worker to exit (the drain's deadlines, then a kill); 0 when every
        worker exited 0."""
        server = self.settings.server
        grace = server.drain_grace_s if self._stopping == signal.SIGTERM else 0.0
        deadline = time.monotonic() + grace + server.shutdown_timeout_s + KILL_AFTER_S
        while any(slot.process.is_alive() for slot in self._slots):
            if time.monotonic() >= deadline:
                log.error("workers still running past the drain's deadline: killing them")
                self._stop(signal.SIGKILL)
                break
            await self._nap()
        codes = []
        for slot in self._slots:
            slot.process.join(1.0)
            codes.append(slot.process.exitcode)
        log.info("workers exited: %s", codes)
        return 0 if all(code == 0 for code in codes) else 1
