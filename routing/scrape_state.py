"""One backend's polling state (`_Backend`), and the two steps on it that need nothing of the
poller's: pointing its next /metrics requests at a path (`_route`), and completing a hot answer
with the last full answer's slow groups (`_completed`).

Contract
- Private to routing/poller.py (hence the underscores). Only the poller's callbacks, on the event
  loop, read or write a `_Backend`: one per backend, created in `Poller.run`, updated in place at
  every scrape, never shared. The rest of routing reads the frozen `BackendSnapshot` the poller
  reports into the Fleet, never this state.
- The rules these fields and steps carry out (Filtering, Tiers, Re-use) are stated in the module
  docstring of routing/poller.py; the hot-answer template's, in routing/hot_template.py.
- `_route` and `_completed` work on the state alone: no I/O, no clock, no logging. `_completed`
  raises `MetricsError` for a hot answer it cannot complete, and the poller then asks for every
  name within the same scrape.
"""

from __future__ import annotations

import dataclasses

from routing.hot_template import _HotTemplate
from routing.metrics import GroupCache, MetricsError, Reading
from routing.metrics.prom import Groups
from routing.metrics.query import METRICS_PATH, completed, filtered_path, hot_path
from routing.scrape_client import Done, ScrapeClient, ScrapeError
from routing.state import BackendSnapshot, BackendSpec


@dataclasses.dataclass(frozen=True, slots=True)
class Reuse:
    """Which of the poller's re-use tiers are on (all, by default). Each one gives the same
    snapshots as parsing every answer whole; switching one off only costs CPU, which is what
    loadtest/bench_scrape.py measures. `byte_equal`: an answer byte for byte equal to the last
    one of its kind is not read again; `series_equal`: one whose series the format reads are
    equal is not parsed again; `group_cache`: of a parsed answer, only the groups that changed
    are parsed; `templates`: a hot answer that differs from the last one only in its numbers is
    read from them."""

    byte_equal: bool = True
    series_equal: bool = True
    group_cache: bool = True
    templates: bool = True


def _unbound(result: bytes | ScrapeError) -> None:
    raise RuntimeError("a poller callback used before it was bound")


@dataclasses.dataclass(slots=True, eq=False)
class _Backend:
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
    was_healthy: bool = False
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
    # The last answer of each kind and its reading (a hot one's completed with `slow`), so that
    # the alternation of full and hot answers of an idle server costs no reading.
    full_memo: tuple[bytes, Reading] | None = None
    hot_memo: tuple[bytes, Reading] | None = None
    # The last hot answer parsed whole, as a template for the next ones (`_HotTemplate`).
    hot_template: _HotTemplate | None = None
    # The last payload parsed, the series read from it, and the snapshot they gave.
    last_body: bytes = b""
    last_reading: Reading | None = None
    last_snapshot: BackendSnapshot | None = None
    groups: GroupCache = dataclasses.field(default_factory=GroupCache)  # the last groups parsed


def _route(backend: _Backend, family: str) -> None:
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


def _completed(backend: _Backend, reading: Reading) -> Reading:
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
