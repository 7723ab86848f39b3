"""The backend poller: the one I/O piece of routing/. Scrapes every backend's /metrics on an
interval and reports into the Fleet.

Where the pieces are: this module schedules the scrapes and handles their answers (`Poller`);
routing/scrape_state.py holds each backend's polling state (`ScrapeState`) and the path its next
scrape asks for; routing/hot_template.py reads hot answers from their numbers;
routing/poll_timing.py holds the pure time arithmetic (`full_every_for`, `retry_delay`),
re-exported here; routing/scrape_client.py is the keep-alive HTTP client. What each
piece saves, measured, is in docs/design.md (loadtest/bench_scrape.py).

- Schedule: backends are scraped in groups of `group_size`, each group at its own phase of the
  interval, every member on the same grid `phase + k * interval`. One timer per group wakes the
  event loop and starts its members' scrapes; each scrape then runs on its own (a callback when
  its answer, failure or timeout comes), so a slow or hanging backend never delays another's
  scrapes. Scraping together costs less (one wake-up per group, not per backend), while phases
  keep each burst of work in the gateway's loop short: a group's answers come back together and
  are parsed in one burst that delays the loop's other work. A member still busy at its group's
  tick, or backed off, skips grid points rather than shifting its schedule.
- Cost: polling runs all the time in the gateway's own loop, hence callbacks rather than a task
  per backend, and the keep-alive client rather than aiohttp for plain-http backends.
- Each scrape has its own deadline (`timeout`) covering connect, response and body. Its snapshot
  is taken at the moment the request is sent: a dispatch after that instant may be missing from
  it, and the Fleet counts such dispatches against it.
- HTTP: one keep-alive connection per plain-http backend. https backends, or every backend when
  the caller passes an aiohttp `session`, go through aiohttp (`SessionClient`). Requests ask for
  `Accept-Encoding: identity`: a gzipped payload would cost the backend and the gateway CPU on
  every scrape, to save loopback-cheap bytes.
- Scrapes report freshness, not health (routing/outlier.py decides that from requests). A scrape
  that fails (connection refused or reset, timeout, a status other than 200, a body too large, a
  payload that is not the backend's format) never stops the polling, and the last snapshot just
  ages; the Fleet is told, and whether the backend answered at all (then it is reachable). A
  refused connection is the exception: the backend is unreachable, out of rotation until a
  scrape or a call reaches it again (`scrape_state.failure_kind`). Any other exception is logged
  and counted as a failure too: the poller must outlive every backend's misbehaviour.
  `on_error` is told the error's class name: `ScrapeConnectError`, `ScrapeTimeout`,
  `ScrapeError` (HTTP status, size, malformed answer) or `MetricsError` (not the format), or an
  unexpected class.
- Backends are scraped every `interval`. After `backoff_after` failed scrapes in a row, a backend
  is probed with exponential backoff (`retry_delay`) until it answers.
- llama.cpp's KV figures come from `GET /slots`, fetched after its /metrics within the same
  deadline; a server with slots disabled (404/501) still yields a snapshot, without KV figures.
- Filtering: vLLM and SGLang render /metrics with prometheus_client, which answers
  `/metrics?name[]=...` with only the samples named (routing/metrics/query.py): a small part of
  the whole payload, less work for us and much less for the backend. A backend of one of those
  formats, as configured or, when auto-detected, once a plain /metrics answer has told its
  format (kept from scrape to scrape), is scraped through the filtered path. A server that
  ignores the query answers the whole payload, read the same way. A filtered scrape answered
  with a status other than 200 (a server or proxy rejecting the query) or with a payload that is
  not the format (a MetricsError: an empty answer from a multiprocess registry, a proxy that
  dropped the query, a server upgraded to other names) is not a failure by itself: the same
  scrape asks plain /metrics at once, within its deadline, and that answer (re-detected when the
  format is not configured) is the scrape's outcome. When plain /metrics succeeds there, the
  filter was the problem: the backend stays on plain /metrics for that format, until it is
  failing (`backoff_after` failed scrapes in a row: a restart may bring another server) or its
  payload turns out to be of another format. When plain fails too, the backend is failing, not
  the filter: it stays on the filtered path. Connection failures and timeouts are failures on
  either path. So the optimisation never costs a backend its state.
- Tiers: of a filtered vLLM answer, routing needs only the load gauges (running, waiting, KV
  usage) fresh at every scrape. The cumulative counters (preemptions, prefix-cache queries and
  hits) move too, but are only read as totals; the cache config (the KV capacity), the LoRA
  adapters and the success counter (read only to tell the simulator) seldom change
  (routing/metrics/vllm.py `HOT_NAMES`). So a backend on a filtered path that has a hot tier
  asks for every name at one grid point in `full_every` (default: about once a second; the
  gateway's `routing.full_scrape_interval_s`), and for the gauges only (its hot path) at the
  others. A hot answer's series are completed with the last full answer's others; the snapshot
  is still built whole at every scrape. A scrape asks for every name when no full answer is
  held: the first filtered scrape, and the one after any failure, fallback or change of path or
  format. Staleness bound: the counters, the cache config (hence KV capacity and block size) and
  the LoRA adapters in a snapshot were read less than `full_every` intervals (+ one scrape's
  time) before its `taken_at`. A hot answer that is not the format, lacks a moving series the
  last full answer had, or is not a 200 is not a failure by itself: the same scrape asks for
  every name, within its deadline, and that answer follows the rules above. When that full
  answer succeeds, the hot query was at fault: the backend asks for every name at every scrape
  until it is failing.
- Hot answers that differ from the last one parsed whole only in their numbers are read from
  them, through a template of that answer (routing/hot_template.py).
- Re-use: an answer whose series that the format reads equal the last answer's (routing/metrics:
  a `Reading`) is not parsed again: the last snapshot is reused with the new `taken_at` (same
  input, same values). A server that ignores the `name[]` query sends its whole payload, whose
  process series move at every scrape while an idle server's load series do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import aiohttp

from routing import scrape_state
from routing.fleet import Fleet
from routing.metrics import MetricsError, parse_slots, with_slots
from routing.metrics.query import METRICS_PATH
from routing.poll_timing import full_every_for, retry_delay
from routing.scrape_client import ScrapeError, ScrapeTimeout
from routing.scrape_session import SessionClient, client_for
from routing.scrape_state import ScrapeState
from routing.state import BackendSnapshot

__all__ = ["Poller", "full_every_for", "retry_delay"]

log = logging.getLogger("kvgate.poller")


@dataclasses.dataclass(slots=True, eq=False)
class _Group:
    members: list[ScrapeState]
    first: float  # loop time of grid point 0
    k: int = 0  # the grid point of the next tick
    timer: asyncio.TimerHandle | None = None


class Poller:
    def __init__(
        self,
        fleet: Fleet,
        *,
        session: aiohttp.ClientSession | None = None,
        interval: float = 0.1,
        timeout: float = 0.5,
        backoff_max: float = 5.0,
        group_size: int = 32,
        full_every: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str, str], None] | None = None,
        templates: bool = True,
        series_equal: bool = True,
        backoff_after: int = 3,
    ) -> None:
        """`session`: an aiohttp session to scrape every backend through (not closed here);
        None = the poller's own keep-alive connections, plus an aiohttp session of its own for
        https backends, for the duration of `run`. `clock` must be the one the Fleet's readers
        pass as `now`. `on_error(backend_id, error_class)` is told of every failed scrape (the
        exception's class name: a small, bounded set, fit for a metric label); it must not
        raise. `full_every`: a backend on a tiered filtered path asks for every name at every
        `full_every`-th grid point, for the moving ones only in between (module docstring);
        None = about once a second, 1 = every name at every scrape. `templates`: hot answers
        are read from their numbers where they can be (False: parsed whole; the answers are the
        same, loadtest/bench_scrape.py measures the difference). `series_equal`: an answer
        whose series equal the last one's reuses its snapshot (False: parsed anyway).
        `backoff_after`: failed scrapes in a row after which a backend is probed with backoff
        and counts as failing (module docstring)."""
        if interval <= 0 or timeout <= 0 or group_size < 1 or backoff_after < 1:
            raise ValueError("need a positive poll interval, scrape timeout, group size and "
                             "backoff_after")
        if full_every is None:
            full_every = full_every_for(1.0, interval)
        if full_every < 1:
            raise ValueError("need full_every >= 1")
        self._fleet = fleet
        self._session = session
        self._interval = interval
        self._timeout = timeout
        self._backoff_max = max(backoff_max, interval)
        self._group_size = group_size
        self._full_every = full_every
        self._clock = clock
        self._on_error = on_error
        self._templates = templates
        self._series_equal = series_equal
        self._backoff_after = backoff_after
        self.scrapes_ok = 0
        self.scrapes_failed = 0
        self.scrapes_filtered = 0  # of scrapes_ok, answered through a `name[]` path
        self.scrapes_hot = 0  # of scrapes_filtered, answered through a hot path
        self.scrapes_templated = 0  # of scrapes_hot, read from their numbers (`HotTemplate`)
        self._unsettled = {spec.id for spec in fleet.specs}  # no scrape of theirs ended yet
        self._first_round = asyncio.Event()

    async def run(self) -> None:
        """Polls every backend until cancelled."""
        loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            own_session: aiohttp.ClientSession | None = None
            backends: list[ScrapeState] = []
            for spec in self._fleet.specs:
                client = client_for(spec.url, self._session, api_key=spec.api_key)
                if client is None:  # https and the like: aiohttp, on a session of our own
                    if own_session is None:
                        own_session = await stack.enter_async_context(_session())
                    client = SessionClient(own_session, spec.url, api_key=spec.api_key)
                stack.push_async_callback(client.close)  # abandons a scrape in flight
                backend = ScrapeState(spec, client, tiered=self._full_every > 1)
                if spec.metrics_format is not None:
                    scrape_state.route(backend, spec.metrics_format)
                backend.on_metrics = partial(self._on_metrics, backend)
                backend.on_slots = partial(self._on_slots, backend)
                backends.append(backend)
            size = self._group_size
            groups = [backends[i : i + size] for i in range(0, len(backends), size)]
            base = loop.time()
            for i, members in enumerate(groups):
                group = _Group(members, first=base + self._interval * i / len(groups))
                for backend in members:
                    backend.first = group.first
                group.timer = loop.call_at(group.first, self._tick, group)
                stack.callback(_cancel, group)  # runs before the clients close
            await loop.create_future()  # until cancelled

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Poller]:
        """`run` as a background task for the duration of the block (e.g. an aiohttp
        cleanup_ctx); the task is cancelled and awaited on the way out."""
        task = asyncio.create_task(self.run(), name="kvgate-poller")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def first_round(self, timeout_s: float) -> bool:
        """Waits until every backend's first scrape has ended (answered or failed), at most
        `timeout_s`; whether they all did."""
        if self._unsettled:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._first_round.wait()
        return not self._unsettled

    # One scrape, as callbacks: start, /metrics answered, /slots answered (llama.cpp), end.

    def _tick(self, group: _Group) -> None:
        loop = asyncio.get_running_loop()
        k = group.k
        now = loop.time()  # the group's scrapes start in the same instant
        for backend in group.members:
            if not backend.busy and backend.next_k <= k:
                self._start(backend, k, now + self._timeout)
        # The next grid point still ahead: a tick that came late skips the ones it overran.
        behind = math.floor((loop.time() - group.first) / self._interval)
        group.k = max(k + 1, behind + 1)
        group.timer = loop.call_at(group.first + group.k * self._interval, self._tick, group)

    def _start(self, backend: ScrapeState, k: int, deadline: float) -> None:
        backend.busy = True
        backend.started_k = k
        backend.taken_at = self._clock()
        backend.deadline = deadline
        path = backend.path
        if backend.hot is not None and backend.slow is not None and k < backend.full_k:
            path = backend.hot
        backend.fetching = path
        try:
            backend.client.fetch(path, self._timeout, backend.on_metrics)
        except Exception as exc:  # a bug, not the backend: logged, and the group goes on
            self._end(backend, exc)

    def _on_metrics(self, backend: ScrapeState, result: bytes | ScrapeError) -> None:
        try:
            if isinstance(result, ScrapeError):
                if result.status is not None and self._unfilter(backend, result):
                    return
                raise result
            try:
                snapshot, templated = scrape_state.answer_snapshot(
                    backend, result, self._full_every, templates=self._templates,
                    series_equal=self._series_equal)
                self.scrapes_templated += templated
            except MetricsError as exc:
                if self._unfilter(backend, exc):
                    return
                raise
            if snapshot.format == "llamacpp":
                remaining = backend.deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    raise ScrapeTimeout("no time left for /slots within the scrape timeout")
                backend.metrics = snapshot
                backend.client.fetch("/slots", remaining, backend.on_slots)
                return
        except Exception as exc:
            self._end(backend, exc)
        else:
            self._end(backend, snapshot)

    def _unfilter(self, backend: ScrapeState, why: Exception) -> bool:
        """After a filtered answer that failed (module docstring): asks, within the scrape's
        deadline, for every name after a hot answer, else plain /metrics, and returns True;
        False when the answer was plain already."""
        fetching = backend.fetching
        if fetching == METRICS_PATH:
            return False
        hot = fetching == backend.hot
        path = backend.path if hot else METRICS_PATH
        log.debug("backend %s: %s failed (%s: %s); trying %s", backend.spec.id, fetching,
                  type(why).__name__, why, path)
        remaining = backend.deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise ScrapeTimeout(f"no time left for {path} within the scrape timeout")
        if hot:
            backend.hot_failed = True
            backend.slow = None
        else:
            backend.suspect = backend.path_family
        backend.taken_at = self._clock()  # the snapshot is of the new answer
        backend.fetching = path
        backend.client.fetch(path, remaining, backend.on_metrics)
        return True

    def _on_slots(self, backend: ScrapeState, result: bytes | ScrapeError) -> None:
        snapshot, backend.metrics = backend.metrics, None
        assert snapshot is not None
        try:
            if isinstance(result, ScrapeError):
                if result.status not in (404, 501):  # 404/501: slots are disabled, not a failure
                    raise result
            else:
                slots = parse_slots(result, unified=backend.spec.kv_unified)
                snapshot = with_slots(snapshot, slots)
        except Exception as exc:
            self._end(backend, exc)
        else:
            self._end(backend, snapshot)

    def _end(self, backend: ScrapeState, outcome: BackendSnapshot | Exception) -> None:
        """Reports the scrape, then sets the backend's next grid point."""
        spec = backend.spec
        try:
            note = scrape_state.settle_paths(backend, answered=isinstance(outcome, BackendSnapshot))
            if note is not None:
                log.info("backend %s (%s) %s", spec.id, spec.url, note)
            if isinstance(outcome, BackendSnapshot):
                self._record_ok(backend, outcome)
            else:
                if not isinstance(outcome, ScrapeError | MetricsError):
                    log.error("backend %s: unexpected error while scraping", spec.id,
                              exc_info=outcome)
                self._failed(backend, outcome)
        finally:
            self._unsettled.discard(spec.id)
            if not self._unsettled:
                self._first_round.set()
            backend.busy = False
            delay = self._interval
            if backend.failures:
                delay = retry_delay(
                    self._interval, backend.failures, self._backoff_after, self._backoff_max
                )
            now = asyncio.get_running_loop().time()
            due = max(backend.first + backend.started_k * self._interval + delay, now)
            backend.next_k = math.ceil((due - backend.first) / self._interval - 1e-9)

    def _record_ok(self, backend: ScrapeState, snapshot: BackendSnapshot) -> None:
        spec = backend.spec
        self._fleet.record_scrape(spec.id, snapshot)
        self.scrapes_ok += 1
        if backend.fetching != METRICS_PATH:
            self.scrapes_filtered += 1
            if backend.fetching == backend.hot:
                self.scrapes_hot += 1
        if backend.failures >= self._backoff_after:
            log.info("backend %s (%s) answers its metrics again", spec.id, spec.url)
        backend.failures = 0

    def _failed(self, backend: ScrapeState, exc: Exception) -> None:
        spec = backend.spec
        kind = scrape_state.failure_kind(exc)
        refused = kind == scrape_state.UNREACHABLE
        if refused:
            self._fleet.record_unreachable(spec.id, self._clock())
        else:
            answered = kind == scrape_state.ANSWERED
            self._fleet.record_scrape_failure(spec.id, self._clock(), answered=answered)
        backend.failures += 1
        self.scrapes_failed += 1
        backend.slow = None  # it may answer next as another server: every name, first
        if self._on_error is not None:
            self._on_error(spec.id, type(exc).__name__)
        why = f"{type(exc).__name__}: {exc}"
        if backend.failures == self._backoff_after:
            what = ("refuses connections: out of rotation until it answers" if refused
                    else "its metrics fail: routed by the gateway's own ledger meanwhile")
            log.warning("backend %s (%s) %s (%s)", spec.id, spec.url, what, why)
            scrape_state.start_over(backend, tiered=self._full_every > 1)
        else:
            log.debug("backend %s: scrape failed: %s", spec.id, why)


def _cancel(group: _Group) -> None:
    if group.timer is not None:
        group.timer.cancel()


def _session() -> aiohttp.ClientSession:
    """The poller's own aiohttp session, for the backends the keep-alive client does not
    speak to: no connection limit, no cookies, no automatic Accept-Encoding."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("Accept-Encoding",),
    )
