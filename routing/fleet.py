"""Every backend's spec, latest snapshot, health and the gateway's ledger: what routing reads.

Pure: no I/O, no clock. The poller reports scrapes into it, the proxy reports dispatches (leases),
successes and failures, and policies read `Candidate`s out of it. Every method that needs the time
takes `now` (monotonic seconds, the same clock as `BackendSnapshot.taken_at`).

Rules
- Snapshots are replaced whole by the poller; a scrape older than the one held is ignored.
- Freshness: a snapshot older than `max_snapshot_age` is stale (`Candidate.stale`); so is a missing
  one. Staleness is a check on `taken_at` at read time, never a flag to clear.
- Freshness only affects routing quality: a stale or missing snapshot never takes a backend out
  of rotation (policies route it by the ledger and prefer fresh ones). A failed scrape is
  counted (`scrape_failures`); one that got an answer says the backend is reachable.
- Health comes from requests' outcomes (the relay's reports), by routing/outlier.py's rules:
  reachability (a refused connection takes a backend out whatever the cap, until a scrape or a
  call reaches it again), ejection after `rules.consecutive_failures` failures in a row (for
  longer at each ejection, within the cap on each model's ejected share), hold-off by a
  Retry-After. Candidates are the backends available now: reachable, not ejected, not held.
  Ejections and the ejections the cap refused are counted for metrics.
- Models a backend serves: those discovered (`set_models`), else the configured ones, else what
  its metrics name (vLLM/SGLang `model_name` labels and LoRA adapters in use).
- Effective free KV (`effective_free_blocks`, what KV-aware policies should use): the last
  scrape's free blocks minus the blocks the gateway expects from the requests it dispatched at or
  after the scrape's `taken_at` (the scrape cannot have seen them), so requests arriving between
  two scrapes spread out instead of all landing on the backend that looked emptiest. A stale
  snapshot is never read as idle: it keeps its last reading minus the dispatches since, and is
  further capped by the ledger (capacity minus every block the gateway has reserved there). With
  no snapshot, or no free-block figure, the effective free KV is unknown (None), never "all".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from routing import outlier
from routing.kv_hold import Hold
from routing.ledger import Lease, Ledger
from routing.outlier import FAILURE_REASONS, Event, Health, OutlierRules
from routing.state import BackendSnapshot, BackendSpec, Candidate

__all__ = ["FAILURE_REASONS", "Fleet", "OutlierRules", "effective_free_blocks"]


@dataclass(slots=True)
class _Backend:
    spec: BackendSpec
    discovered_models: tuple[str, ...] | None = None
    snapshot: BackendSnapshot | None = None
    health: Health = field(default_factory=Health)
    scrape_failures: int = 0  # in a row: freshness, not health
    ledger: Ledger = field(default_factory=Ledger)
    # The last Candidate built and the ledger version it read: a Candidate is a pure function of
    # the spec, health, snapshot, staleness and ledger, and between two decisions most backends
    # change none of them, so the next decision reuses it (building one costs more than checking).
    view: Candidate | None = None
    view_version: int = -1


class Fleet:
    """One per gateway process. See the module docstring for the rules."""

    def __init__(
        self,
        specs: Sequence[BackendSpec],
        *,
        max_snapshot_age: float = 1.0,
        rules: OutlierRules | None = None,
    ) -> None:
        if max_snapshot_age <= 0:
            raise ValueError("max_snapshot_age must be positive")
        self._specs = tuple(specs)
        self._backends = {spec.id: _Backend(spec) for spec in self._specs}
        if len(self._backends) != len(self._specs):
            raise ValueError("backend ids must be unique")
        self.max_snapshot_age = max_snapshot_age
        self.rules = rules or OutlierRules()
        self._ejections: Counter[tuple[str, str]] = Counter()  # (backend, reason)
        self._capped: Counter[str] = Counter()  # by backend

    @property
    def specs(self) -> tuple[BackendSpec, ...]:
        return self._specs

    def spec(self, backend_id: str) -> BackendSpec:
        return self._backends[backend_id].spec

    def snapshot(self, backend_id: str) -> BackendSnapshot | None:
        return self._backends[backend_id].snapshot

    # Models.

    def set_models(self, backend_id: str, models: tuple[str, ...]) -> None:
        self._backends[backend_id].discovered_models = tuple(models)

    def models_of(self, backend_id: str) -> tuple[str, ...]:
        return self._models(self._backends[backend_id])

    @staticmethod
    def _models(backend: _Backend) -> tuple[str, ...]:
        if backend.discovered_models is not None:
            return backend.discovered_models
        if backend.spec.models:
            return backend.spec.models
        snapshot = backend.snapshot
        return snapshot.models if snapshot is not None and snapshot.models else ()

    def healthy_models(self, now: float) -> list[str]:
        """The models of the backends in rotation."""
        models: set[str] = set()
        for backend in self._backends.values():
            if outlier.in_rotation(backend.health, now):
                models.update(self._models(backend))
        return sorted(models)

    # Freshness: what the poller reports. Scrapes never decide health, but one that got an
    # answer says the backend is reachable.

    def record_scrape(self, backend_id: str, snapshot: BackendSnapshot) -> None:
        """A successful scrape: the snapshot is replaced unless the one held was taken later, and
        the backend is reachable."""
        backend = self._backends[backend_id]
        if backend.snapshot is None or snapshot.taken_at >= backend.snapshot.taken_at:
            backend.snapshot = snapshot
        backend.health = outlier.on_reached(backend.health)
        backend.scrape_failures = 0

    def record_scrape_failure(self, backend_id: str, now: float, *, answered: bool) -> None:
        """A failed scrape (a refused connection is `record_unreachable` instead): the snapshot
        just ages. `answered`: the backend answered (an error status, a payload of no known
        format), so it is reachable."""
        backend = self._backends[backend_id]
        backend.scrape_failures += 1
        if answered:
            backend.health = outlier.on_reached(backend.health)

    def record_success(self, backend_id: str, now: float) -> None:
        """A call that is neither a scrape nor a request answered (model discovery): the backend
        is reachable; its request failures in a row are untouched."""
        backend = self._backends[backend_id]
        backend.health = outlier.on_reached(backend.health)

    # Health: what requests' outcomes say (the relay's reports).

    def record_request_success(self, backend_id: str, now: float) -> None:
        """A backend answered a request (any status below 500 but 429, or a whole stream)."""
        backend = self._backends[backend_id]
        backend.health = outlier.on_success(backend.health)

    def record_request_failure(self, backend_id: str, now: float, reason: str) -> None:
        """A request failed at the backend: `reason` is one of FAILURE_REASONS. Never a 4xx,
        never a client disconnect. The failure that reaches the threshold ejects the backend
        when the cap allows (routing/outlier.py)."""
        backend = self._backends[backend_id]
        health, rules = backend.health, self.rules
        allows = False
        if reason in FAILURE_REASONS and outlier.would_eject(health, now, rules):
            allows = outlier.cap_allows(self._cap_groups(backend, now),
                                        rules.max_ejected_fraction)
        backend.health, event = outlier.on_failure(health, now, reason, rules, cap_allows=allows)
        if event is Event.EJECTED:
            self._ejections[(backend_id, reason)] += 1
        elif event is Event.CAPPED:
            self._capped[backend_id] += 1

    def _cap_groups(self, backend: _Backend, now: float) -> list[tuple[int, int]]:
        """(ejected now, reachable) among the backends of each of `backend`'s models (the whole
        fleet when it names none), `backend` counted as reachable."""
        models = self._models(backend)
        groups: list[tuple[int, int]] = []
        for model in models or (None,):
            out = reachable = 0
            for other in self._backends.values():
                if model is not None and model not in self._models(other):
                    continue
                health = other.health
                if other is backend or health.reachable:
                    reachable += 1
                    out += other is not backend and outlier.ejected(health, now)
            groups.append((out, reachable))
        return groups

    def record_unreachable(self, backend_id: str, now: float) -> None:
        """A connection to the backend was refused or could not be made: out of rotation, whatever
        the cap, until a scrape or a call reaches it again."""
        backend = self._backends[backend_id]
        backend.health = outlier.on_unreachable(backend.health)

    def hold_off(self, backend_id: str, until: float) -> None:
        """The backend asked for no traffic before `until` (a 429 or 503 with Retry-After): it
        is no candidate until then, without being ejected."""
        backend = self._backends[backend_id]
        backend.health = outlier.on_hold(backend.health, until)

    def adopt_holds(self, backend_id: str, ejected_until: float, held_until: float) -> None:
        """Another worker of the host ejected the backend, or was told to hold it off, until
        then (routing/shared_health.py): so does this Fleet, the later of its own and theirs.
        Its failure count and ejection multiplier stay its own."""
        backend = self._backends[backend_id]
        health = backend.health
        if ejected_until > health.ejected_until or held_until > health.held_until:
            backend.health = replace(health,
                                     ejected_until=max(ejected_until, health.ejected_until),
                                     held_until=max(held_until, health.held_until))

    def held_until(self, backend_id: str) -> float:
        return self._backends[backend_id].health.held_until

    def health(self, backend_id: str) -> Health:
        return self._backends[backend_id].health

    def is_healthy(self, backend_id: str, now: float) -> bool:
        """In rotation at `now`: reachable and not ejected (a hold-off is not counted)."""
        return outlier.in_rotation(self._backends[backend_id].health, now)

    def consecutive_failures(self, backend_id: str) -> int:
        """Request failures in a row."""
        return self._backends[backend_id].health.failures

    def scrape_failures(self, backend_id: str) -> int:
        """Failed scrapes in a row."""
        return self._backends[backend_id].scrape_failures

    def back_in(self, model: str | None, now: float) -> float | None:
        """Seconds until a backend serving `model` (any model when None) is available again by
        an ejection or hold ending; 0.0 when one is now; None when none will be by itself."""
        return outlier.back_in(
            (b.health for b in self._backends.values()
             if model is None or model in self._models(b)), now)

    def ejection_counts(self) -> Mapping[tuple[str, str], int]:
        """Ejections so far by (backend, reason of the failure that made it): a read-only view."""
        return self._ejections

    def capped_counts(self) -> Mapping[str, int]:
        """Ejections the cap refused so far, by backend: a read-only view."""
        return self._capped

    # Routing.

    def share_ledgers(self, make: Callable[[int, str], Ledger]) -> None:
        """Replaces every backend's ledger by `make(index, backend_id)` (index in configuration
        order): the ledgers of the host's workers (routing/shared_ledger.py). Only before the
        first lease."""
        for i, (backend_id, backend) in enumerate(self._backends.items()):
            if backend.ledger.version:
                raise RuntimeError("share_ledgers after a lease was taken")
            backend.ledger, backend.view, backend.view_version = make(i, backend_id), None, -1

    def lease(self, backend_id: str, hold: Hold | int, now: float) -> Lease:
        """The ledger entry of one request to `backend_id`, counted from entering the lease
        (the dispatch) to leaving it. `hold`: the KV blocks it is expected to hold
        (routing/kv_hold.py; a count: exactly that many)."""
        return Lease(self._backends[backend_id].ledger, hold, now)

    def candidate(self, backend_id: str, now: float) -> Candidate:
        return self._candidate(self._backends[backend_id], now)

    def _candidate(self, backend: _Backend, now: float) -> Candidate:
        ledger = backend.ledger
        snapshot = backend.snapshot
        # snapshot.is_stale and outlier.in_rotation, inlined: this runs for every backend at
        # every decision.
        stale = snapshot is None or now - snapshot.taken_at > self.max_snapshot_age
        health = backend.health
        healthy = health.reachable and now >= health.ejected_until
        view = backend.view
        if (view is not None and view.snapshot is snapshot and view.stale == stale
                and view.healthy == healthy and backend.view_version == ledger.version):
            return view
        inflight, reserved = ledger.inflight, ledger.reserved_blocks
        if snapshot is None:
            view = Candidate(backend.spec, healthy, None, True, inflight, reserved,
                             inflight, reserved)
        else:
            since, blocks = ledger.since(snapshot.taken_at)
            view = Candidate(backend.spec, healthy, snapshot, stale, inflight, reserved,
                             since, blocks)
        backend.view, backend.view_version = view, ledger.version
        return view

    def candidates(self, model: str | None, now: float) -> list[Candidate]:
        """The backends serving `model` (any model when None) available for a new request:
        reachable, not ejected, not held off (routing/outlier.py); in configuration order."""
        out: list[Candidate] = []
        for backend in self._backends.values():  # configuration order
            health = backend.health
            if (health.reachable and now >= health.ejected_until and now >= health.held_until
                    and (model is None or model in self._models(backend))):
                out.append(self._candidate(backend, now))
        return out

    def admin_rows(self, now: float) -> list[dict[str, object]]:
        """One row per backend, the fields `GET /admin/backends` documents (README.md); a figure
        nobody reported is None (JSON null). Times are seconds from `now`."""
        rows: list[dict[str, object]] = []
        for spec in self._specs:
            c = self.candidate(spec.id, now)
            snap = c.snapshot
            backend = self._backends[spec.id]
            health = backend.health
            rows.append({
                "id": spec.id,
                "url": spec.url,
                "models": list(self.models_of(spec.id)),
                "format": snap.format if snap is not None else spec.metrics_format,
                "healthy": c.healthy,
                "kv_total_blocks": snap.kv_total_blocks if snap else None,
                "kv_free_blocks": snap.kv_free_blocks if snap else None,
                "kv_usage": snap.kv_usage if snap else None,
                "block_size": snap.block_size if snap else None,
                "running": snap.running if snap else None,
                "waiting": snap.waiting if snap else None,
                "inflight": c.inflight,
                "reserved_blocks": c.reserved_blocks,
                "last_poll_age_ms": round(snap.age(now) * 1000.0, 1) if snap else None,
                "stale": c.stale,
                "effective_free_blocks": effective_free_blocks(c),
                "preemptions": snap.preemptions if snap else None,
                "prefix_cache_hit_rate": snap.prefix_cache_hit_rate if snap else None,
                "reachable": health.reachable,
                "consecutive_failures": health.failures,
                "ejected_until": _ahead(health.ejected_until, now),
                "ejections": health.ejections,
                "held_for_s": _ahead(health.held_until, now),
                "scrape_failures": backend.scrape_failures,
            })
        return rows


def _ahead(at: float, now: float) -> float | None:
    """Seconds from `now` to `at` when that is ahead, else None."""
    return round(at - now, 1) if at > now else None


def effective_free_blocks(candidate: Candidate) -> int | None:
    """KV blocks a new request can expect to find free, by the module docstring's rule."""
    snapshot = candidate.snapshot
    if snapshot is None or snapshot.kv_free_blocks is None:
        return None
    free = snapshot.kv_free_blocks - candidate.blocks_since_scrape
    if candidate.stale and snapshot.kv_total_blocks is not None:
        free = min(free, snapshot.kv_total_blocks - candidate.reserved_blocks)
    return max(0, free)
