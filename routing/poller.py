"""The backend poller: the one I/O piece of routing/. Scrapes every backend's /metrics on an
interval and reports into the Fleet.

- One task per gateway process (`Poller.run`), with one child loop per backend, so a slow or
  hanging backend never delays another's scrapes.
- Schedule: backends are scraped in groups of `group_size`, each group at its own phase of the
  interval, every member on the same grid `phase + k * interval`. Scraping together is cheaper
  (the event loop wakes once per group, not once per backend: measured ~25% less CPU for 32
  backends at 100 ms in groups of 8 than one by one), while phases keep each burst of work in the
  gateway's loop short. A scrape that overruns or a backed-off backend skips grid points rather
  than shifting its schedule.
- Each scrape has its own deadline (`timeout`) covering connect, response and body. Its snapshot
  is taken at the moment the request is sent: a dispatch after that instant may be missing from
  it, and the Fleet counts such dispatches against it.
- A scrape that fails (connection refused or reset, timeout, a status other than 200, a body too
  large, a payload that is not the backend's format) is a failure reported to the Fleet; it never
  ends the loop, and the backend's last snapshot just ages. Any other exception is logged and
  counted as a failure too: the poller must outlive every backend's misbehaviour.
- Healthy backends are scraped every `interval`. Once the Fleet marks a backend unhealthy, it is
  probed with exponential backoff (`retry_delay`) until it answers.
- Requests go without Accept-Encoding: a gzipped payload would cost the backend (vLLM's Python API
  server compresses at level 9) and the gateway CPU on every scrape, to save loopback-cheap bytes.
- llama.cpp's KV figures come from `GET /slots`, fetched after its /metrics within the same
  deadline; a server with slots disabled (404/501) still yields a snapshot, without KV figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
from yarl import URL

from routing.fleet import Fleet
from routing.metrics import MetricsError, parse_metrics, parse_slots, with_slots
from routing.state import BackendSnapshot, BackendSpec

log = logging.getLogger("kvgate.poller")

MAX_BODY_BYTES = 8 * 1024 * 1024  # a metrics payload is ~100 KB; anything this big is broken
_NO_ENCODING = ("Accept-Encoding",)


class ScrapeError(Exception):
    """One scrape failed; the message says why."""


class Poller:
    def __init__(
        self,
        fleet: Fleet,
        *,
        session: aiohttp.ClientSession | None = None,
        interval: float = 0.1,
        timeout: float = 0.5,
        backoff_max: float = 5.0,
        group_size: int = 8,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str, str], None] | None = None,
    ) -> None:
        """`session`: the HTTP client to use (not closed here; best without an Accept-Encoding
        auto-header, as the gateway's upstream session is); None = the poller creates its own for
        the duration of `run`. `clock` must be the one the Fleet's readers pass as `now`.
        `on_error(backend_id, error_class)` is told of every failed scrape (the exception's class
        name: a small, bounded set, fit for a metric label); it must not raise."""
        if interval <= 0 or timeout <= 0 or group_size < 1:
            raise ValueError("need a positive poll interval, scrape timeout and group size")
        self._fleet = fleet
        self._session = session
        self._interval = interval
        self._timeout = timeout
        self._backoff_max = max(backoff_max, interval)
        self._group_size = group_size
        self._clock = clock
        self._on_error = on_error
        # URLs parsed once: building a yarl.URL per request is a measurable share of a scrape.
        self._urls = {
            spec.id: (URL(spec.url + "/metrics"), URL(spec.url + "/slots")) for spec in fleet.specs
        }
        self.scrapes_ok = 0
        self.scrapes_failed = 0

    async def run(self) -> None:
        """Polls every backend until cancelled."""
        if self._session is not None:
            await self._run(self._session)
            return
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        async with aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_NO_ENCODING,
        ) as session:
            await self._run(session)

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

    async def poll_once(self, session: aiohttp.ClientSession, spec: BackendSpec) -> bool:
        """One scrape of one backend, reported to the Fleet. True on success. Never raises
        (cancellation aside)."""
        was_healthy = self._fleet.is_healthy(spec.id)
        try:
            snapshot = await self.scrape(session, spec)
        except (ScrapeError, MetricsError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(spec, was_healthy, exc)
            return False
        except Exception as exc:  # the poller outlives any backend's misbehaviour
            log.exception("backend %s: unexpected error while scraping", spec.id)
            self._failed(spec, was_healthy, exc)
            return False
        self._fleet.record_scrape(spec.id, snapshot)
        self.scrapes_ok += 1
        if not was_healthy:
            log.info("backend %s (%s) answers its metrics: healthy", spec.id, spec.url)
        return True

    async def scrape(self, session: aiohttp.ClientSession, spec: BackendSpec) -> BackendSnapshot:
        """One snapshot of `spec`'s backend, within the scrape deadline."""
        taken_at = self._clock()
        async with asyncio.timeout(self._timeout):
            metrics_url, slots_url = self._urls[spec.id]
            status, body = await _get(session, metrics_url)
            if status != 200:
                raise ScrapeError(f"/metrics answered HTTP {status}")
            snapshot = parse_metrics(
                body.decode("utf-8", errors="replace"),
                taken_at=taken_at,
                format=spec.metrics_format,
                max_batch_total_tokens=spec.max_batch_total_tokens,
            )
            if snapshot.format == "llamacpp":
                status, body = await _get(session, slots_url)
                if status == 200:
                    snapshot = with_slots(snapshot, parse_slots(body))
                elif status not in (404, 501):  # 404/501: slots are disabled, not a failure
                    raise ScrapeError(f"/slots answered HTTP {status}")
        return snapshot

    async def _run(self, session: aiohttp.ClientSession) -> None:
        specs = self._fleet.specs
        groups = max(1, math.ceil(len(specs) / self._group_size))
        base = asyncio.get_running_loop().time()
        async with asyncio.TaskGroup() as tasks:
            for i, spec in enumerate(specs):
                phase = self._interval * (i // self._group_size) / groups
                tasks.create_task(self._loop(session, spec, base + phase), name=f"poll-{spec.id}")

    async def _loop(self, session: aiohttp.ClientSession, spec: BackendSpec, first: float) -> None:
        """Scrapes on the grid `first + k * interval` (event-loop time), skipping grid points
        while a scrape runs late or the backend is backed off, so that a group stays together."""
        loop = asyncio.get_running_loop()
        next_at = first
        while True:
            await asyncio.sleep(next_at - loop.time())
            await self.poll_once(session, spec)
            delay = retry_delay(
                self._interval,
                self._fleet.consecutive_failures(spec.id),
                self._fleet.failure_threshold,
                self._backoff_max,
            )
            due = max(next_at + delay, loop.time())
            next_at = first + math.ceil((due - first) / self._interval - 1e-9) * self._interval

    def _failed(self, spec: BackendSpec, was_healthy: bool, exc: Exception) -> None:
        self._fleet.record_failure(spec.id, self._clock())
        self.scrapes_failed += 1
        if self._on_error is not None:
            self._on_error(spec.id, type(exc).__name__)
        why = f"{type(exc).__name__}: {exc}"
        if was_healthy and not self._fleet.is_healthy(spec.id):
            log.warning("backend %s (%s) marked unhealthy: %s", spec.id, spec.url, why)
        else:
            log.debug("backend %s: scrape failed: %s", spec.id, why)


def retry_delay(interval: float, failures: int, threshold: int, backoff_max: float) -> float:
    """Time to the next scrape: the interval while fewer than `threshold` scrapes in a row have
    failed, then doubling with each further failure, up to `backoff_max`."""
    if failures < threshold:
        return interval
    return min(backoff_max, interval * 2.0 ** min(failures - threshold + 1, 32))


async def _get(session: aiohttp.ClientSession, url: URL) -> tuple[int, bytes]:
    """(status, body); the body only for a 200, and never more than MAX_BODY_BYTES."""
    async with session.get(url, allow_redirects=False) as resp:
        if resp.status != 200:
            return resp.status, b""
        length = resp.content_length
        if length is not None:
            if length > MAX_BODY_BYTES:
                raise ScrapeError(f"{url} is {length} bytes")
            return resp.status, await resp.read()
        chunks: list[bytes] = []  # chunked encoding: count as it comes
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ScrapeError(f"{url} is larger than {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        return resp.status, b"".join(chunks)
