"""One backend's polling state (`ScrapeState`), and the steps on it that need nothing of the
poller's: the snapshot of an answer (`answer_snapshot`), pointing the next /metrics requests at a
path (`route`), and completing a hot answer with the last full answer's slow groups
(`completed_hot`).

Contract
- Only the poller's callbacks (routing/poller.py), on the event loop, read or write a
  `ScrapeState`: one per backend, created in `Poller.run`, updated in place at every scrape,
  never shared. The rest of routing reads the frozen `BackendSnapshot` the poller reports into
  the Fleet, never this state.
- The rules these fields and steps carry out (Filtering, Tiers, Re-use) are stated in the module
  docstring of routing/poller.py; the hot-answer template's, in routing/hot_template.py.
- `failure_kind` tells the Fleet what a failed scrape says of the backend (routing/poller.py).
- These steps work on the state and their arguments alone: no I/O, no clock, no logging.
  `answer_snapshot` (through `completed_hot`) raises `MetricsError` for a hot answer it cannot
  complete, and the poller then asks for every name within the same scrape.
"""

from __future__ import annotations

import dataclasses

import aiohttp

from routing.hot_template import HotTemplate
from routing.metrics import MetricsError, Reading, read_metrics, snapshot_of
from routing.metrics.prom import Groups
from routing.metrics.query import METRICS_PATH, completed, filtered_path, hot_path, slow_groups
from routing.scrape_client import Done, ScrapeClient, ScrapeConnectError, ScrapeError, ScrapeTimeout
from routing.state import BackendSnapshot, BackendSpec

# What a failed scrape says of the backend (`failure_kind`).
UNREACHABLE = "unreachable"
ANSWERED = "answered"
SILENT = "silent"


def _unbound(result: bytes | ScrapeError) -> None:
    raise RuntimeError("a poller callback used before it was bound")


@dataclasses.dataclass(slots=True, eq=False)
class ScrapeState:
    """One backend's polling state; only the poller's callbacks touch it."""

    spec: BackendSpec
    client: ScrapeClient
    on_metrics: Done = _unbound  # the poller's callbacks, bound to this backend once (in `run`)
    on_slots: Done = _unbound
    first: float = 0.0  # loop time of its group's grid point 0
    next_k: int = 0  # the grid point of its next scrape
    busy: bool = False
    # The scrape in progress.
    started_k: int = 0
    taken_at: float = 0.0
    deadline: float = 0.0  # loop time
    failures: int = 0  # failed scrapes in a row
    fetching: str = METRICS_PATH  # the path of the /metrics request in flight
    metrics: BackendSnapshot | None = None  # llama.cpp: parsed, waiting for /slots
    # Filtering (routing/poller.py): the path of the next /metrics request, the format it asks
    # for (None: plain /metrics), and the format whose filtered answer failed on this backend.
    path: str = METRICS_PATH
    path_family: str | None = None
    unfiltered: str | None = None
    suspect: str | None = None  # the format whose filtered answer failed in this scrape
    # Tiers (routing/poller.py): the hot path of `path_family` (None: none, or not used here),
    # whether this backend may use one, the last full answer's slow groups and the hot names it
    # had (None: the next filtered scrape asks for every name), the grid point from which a
    # scrape is full again, and whether the hot answer failed in this scrape.
    hot: str | None = None
    tiered: bool = True
    slow: Groups | None = None
    hot_names: tuple[str, ...] = ()
    full_k: int = 0
    hot_failed: bool = False
    # The last hot answer parsed whole, as a template for the next ones (`HotTemplate`).
    hot_template: HotTemplate | None = None
    # The series read from the last answer (None: read from its numbers), and its snapshot: on
    # a tiered path, the full answer's slow groups come from the reading.
    last_reading: Reading | None = None
    last_snapshot: BackendSnapshot | None = None


def route(backend: ScrapeState, family: str) -> None:
    """Points the backend's next /metrics request at the filtered path for `family` when its
    servers filter and that path has not failed on this backend, else at plain /metrics; and
    its hot scrapes at `family`'s hot path, if any and tiers are on, once a full answer came."""
    path = filtered_path(family) if family != backend.unfiltered else None
    backend.slow = None
    if path is None:
        backend.path, backend.path_family, backend.hot = METRICS_PATH, None, None
    else:
        backend.path, backend.path_family = path, family
        backend.hot = hot_path(family) if backend.tiered else None


def settle_paths(backend: ScrapeState, *, answered: bool) -> str | None:
    """At the end of a scrape whose filtered or hot request failed and whose retry `answered`:
    the query was at fault, so the backend stops asking it (Filtering, Tiers); returns what to
    log, or None."""
    suspect, backend.suspect = backend.suspect, None
    hot_failed, backend.hot_failed = backend.hot_failed, False
    if not answered:
        return None
    if suspect is not None:  # plain /metrics answered where the filtered path did not
        backend.unfiltered = suspect
        if backend.path_family == suspect:
            backend.path, backend.path_family, backend.hot = METRICS_PATH, None, None
        return (f"does not answer /metrics?name[]=... for {suspect} metrics: scraping plain "
                "/metrics")
    if hot_failed:  # every name answered where the moving ones did not
        backend.tiered = False
        backend.hot = backend.slow = None
        return ("does not answer the hot /metrics?name[]=... query: asking for every name at "
                "every scrape")
    return None


def start_over(backend: ScrapeState, *, tiered: bool) -> None:
    """The backend's scrapes keep failing: when it answers again it may be another server, so
    filtering and tiers get another try."""
    backend.unfiltered = None
    backend.tiered = tiered
    family = backend.spec.metrics_format or (
        backend.last_reading.family if backend.last_reading is not None else None)
    if family is not None:
        route(backend, family)


def failure_kind(error: BaseException) -> str:
    """What a failed scrape says of the backend: UNREACHABLE when the connection could not be
    made (refused, no route, no such host), ANSWERED when the backend answered (a status other
    than 200, a body too large or malformed, a payload of no known format), SILENT otherwise (a
    timeout, a connection lost mid-answer, an unexpected error)."""
    if isinstance(error, ScrapeTimeout):
        return SILENT
    if isinstance(error, ScrapeConnectError):
        cause = error.__cause__
        # The keep-alive client chains the OSError of the connect; aiohttp raises
        # ClientConnectorError for it (its other OSErrors come after the connection was made).
        if isinstance(cause, aiohttp.ClientConnectorError) or (
                isinstance(cause, OSError) and not isinstance(cause, aiohttp.ClientOSError)):
            return UNREACHABLE
        return SILENT
    if isinstance(error, ScrapeError | MetricsError):
        return ANSWERED
    return SILENT


def completed_hot(backend: ScrapeState, reading: Reading) -> Reading:
    """A hot answer's reading completed with the last full answer's slow groups. Raises
    MetricsError (the scrape then asks for every name) when it is not of the backend's format
    or lacks a moving series the full answer had."""
    slow, groups = backend.slow, reading.groups
    if slow is None or reading.family != backend.path_family:
        raise MetricsError(f"a hot answer of another format ({reading.family})")
    for name in backend.hot_names:
        if name not in groups:
            raise MetricsError(f"a hot answer without {name}, which the full answer had")
    return completed(reading, slow)


def answer_snapshot(
    backend: ScrapeState, body: bytes, full_every: int, *, templates: bool = True,
    series_equal: bool = True,
) -> tuple[BackendSnapshot, bool]:
    """The snapshot of the answer `body` to the request the backend's scrape sent
    (`backend.fetching`), and whether it was read from its numbers (a `HotTemplate`, when
    `templates`). When `series_equal`, an answer whose series (its `Reading`) equal the last
    answer's gives the last snapshot, restamped. A hot answer's series are completed with the
    last full answer's slow ones; a full filtered answer's are kept for the hot answers until
    the next one, which is asked for `full_every` grid points after this scrape's. Raises
    MetricsError for an answer that is not the backend's format."""
    hot = backend.fetching == backend.hot
    template = backend.hot_template if hot else None
    if template is not None and template.slow is not backend.slow:
        template = backend.hot_template = None
    if template is not None:
        from_numbers = template.snapshot_of(body, backend.taken_at)
        if from_numbers is not None:
            # No reading: the next full answer, or hot answer unlike this one, is read and parsed
            # whole.
            backend.last_reading, backend.last_snapshot = None, from_numbers
            return from_numbers, True
    spec = backend.spec
    reading = read_metrics(body, format=spec.metrics_format)
    if hot:
        reading = completed_hot(backend, reading)
    last = backend.last_snapshot
    if series_equal and last is not None and reading == backend.last_reading:
        snapshot = last._replace(taken_at=backend.taken_at)
    else:
        snapshot = snapshot_of(
            reading, taken_at=backend.taken_at,
            max_batch_total_tokens=spec.max_batch_total_tokens)
        if hot and templates and (template is None or template.values is not None):
            assert backend.slow is not None  # a hot answer is completed with it
            backend.hot_template = HotTemplate.of(
                body, reading, snapshot, backend.slow, backend.hot_names)
    backend.last_reading, backend.last_snapshot = reading, snapshot
    if reading.family != backend.path_family:
        route(backend, reading.family)
    if backend.hot is not None and backend.fetching == backend.path:
        _full_answered(backend, snapshot, full_every)
    return snapshot, False


def _full_answered(backend: ScrapeState, snapshot: BackendSnapshot, full_every: int) -> None:
    """A full answer on a tiered path: its slow groups complete the hot answers until the next
    one."""
    family, full = backend.path_family, backend.last_reading
    assert family is not None and full is not None  # a tiered path has both
    slow = slow_groups(family, full.groups)
    hot_names = tuple(name for name in full.groups if name not in slow)
    if slow != backend.slow or hot_names != backend.hot_names:
        # Read with other slow groups, or checked for other names: the template (tied to the
        # `slow` object) ends, unless it can take this answer's slow groups.
        template = backend.hot_template
        if template is not None and hot_names == backend.hot_names:
            template = template.rebased(slow, full, snapshot, hot_names)
        else:
            template = None
        backend.hot_template = template
        backend.slow, backend.hot_names = slow, hot_names
    backend.full_k = backend.started_k + full_every
