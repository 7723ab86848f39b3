"""One worker process of `kvgate serve --workers N`: the gateway of gateway/serve.py on uvloop,
listening with SO_REUSEPORT on the host's port, with

- its Fleet's ledgers on the host's table (routing/shared_ledger.py), so it decides on every
  worker's requests in flight;
- its scrapes read from the host's board (gateway/workers/feed.py) instead of a poller of its
  own, so each backend is scraped once per interval per host;
- the host's ejections and Retry-After holds (routing/shared_health.py): a backend one worker
  takes out is out for all within half a poll interval;
- its `/metrics` answers merged with the other workers' (gateway/workers/metrics.py);
- its own queue (a fair share of `routing.queue.max_depth`), connections (a fair share of
  `server.max_connections` and `server.max_upstream_connections`), retry budget, count of
  failures in a row, learned speeds and output lengths.

Started by the supervisor with the 'spawn' method: `main` is the process's target.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path

from aiohttp import web

from gateway import redact
from gateway.config import Settings
from gateway.keys import FLEET, SCRAPE_SOURCE, TELEMETRY
from gateway.lifecycle import configure_logging, run_on_uvloop, serve_until_signalled
from gateway.workers.feed import BoardFeed
from gateway.workers.metrics import WAIT_S, HostMetrics
from gateway.workers.segment import Layout, Segment
from routing.fleet import Fleet
from routing.shared_ledger import HostLedger

log = logging.getLogger("kvgate.workers")


@dataclass(frozen=True, slots=True)
class WorkerArgs:
    index: int
    settings: Settings  # the host's: this worker's share is taken here
    segment: str
    layout: Layout
    metrics_dir: str
    log_level: str


def share_of(total: int, workers: int) -> int:
    """One worker's fair share of a host-wide cap (0 = no cap stays 0)."""
    return 0 if total == 0 else max(1, math.ceil(total / workers))


def worker_settings(settings: Settings, workers: int) -> Settings:
    """The host's settings with one worker's shares of the queue and the connection caps."""
    server, routing = settings.server, settings.routing
    return settings.model_copy(update={
        "server": server.model_copy(update={
            "max_connections": share_of(server.max_connections, workers),
            "max_upstream_connections": share_of(server.max_upstream_connections, workers),
        }),
        "routing": routing.model_copy(update={"queue": routing.queue.model_copy(update={
            "max_depth": share_of(routing.queue.max_depth, workers)})}),
    })


WORKER_HEADER = "x-kvgate-worker"


def _stamp(index: str) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """Every answer names the worker that gave it (which process to look at in its logs)."""
    async def stamp(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_HEADER] = index

    return stamp


PR_SET_PDEATHSIG = 1


def _die_with_supervisor() -> None:
    """A supervisor killed outright (SIGKILL) cannot stop its workers: the kernel sends each
    SIGTERM then (Linux), and it drains and exits instead of serving on alone."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(args: WorkerArgs, ready: Event) -> None:
    _die_with_supervisor()
    if os.getppid() == 1:  # the supervisor died before the line above
        return
    settings = worker_settings(args.settings, args.layout.workers)
    configure_logging(args.log_level, redact.secrets_of(settings))
    segment = Segment.attach(args.segment, args.layout)
    interval = settings.routing.poll_interval_s / 2

    def prepare(app: web.Application) -> None:
        index = args.index
        app[FLEET].share_ledgers(lambda i, _id: HostLedger(segment.ledger, index, i))

        # Worker 0 counts the host's failed scrapes: the host's /metrics sums the workers'.
        on_error = app[TELEMETRY].poll_error if index == 0 else None
        metrics = HostMetrics(Path(args.metrics_dir), index, app[TELEMETRY].render_prometheus,
                              segment.epochs, wait_s=max(WAIT_S, 2 * interval))

        def feed(fleet: Fleet) -> BoardFeed:
            return BoardFeed(fleet, segment.board, interval, segment.holds, index, on_error,
                             on_tick=metrics.check)

        app[SCRAPE_SOURCE] = feed
        app.on_response_prepare.append(_stamp(str(index)))
        app.middlewares.append(metrics.middleware())
        app.cleanup_ctx.append(metrics.writing)

    def on_ready(url: str) -> None:
        log.info("worker %d serving on %s", args.index, url)
        ready.set()

    seed = settings.routing.seed
    rng = None if seed is None else random.Random(seed + args.index)
    try:
        run_on_uvloop(lambda: serve_until_signalled(
            settings, on_ready, reuse_port=True, prepare=prepare, rng=rng))
    finally:
        segment.close()
