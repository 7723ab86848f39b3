"""Every backend's spec, latest snapshot, health and the gateway's ledger: what routing reads.

Pure: no I/O, no clock. The poller reports scrapes into it, the proxy reports dispatches (leases),
successes and failures, and policies read `Candidate`s out of it. Every method that needs the time
takes `now` (monotonic seconds, the same clock as `BackendSnapshot.taken_at`).

Rules
- Snapshots are replaced whole by the poller; a scrape older than the one held is ignored.
- Freshness: a snapshot older than `max_snapshot_age` is stale (`Candidate.stale`); so is a missing
  one. Staleness is a check on `taken_at` at read time, never a flag to clear.
- Health: a backend starts unhealthy until its first successful scrape (or `record_success`, e.g.
  model discovery). `failure_threshold` failures in a row, scrapes or connections, make it
  unhealthy; any success restores it. Unhealthy backends are never candidates.
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

from collections.abc import Sequence
from dataclasses import dataclass, field

from routing.ledger import Lease, Ledger
from routing.state import BackendSnapshot, BackendSpec, Candidate

# Why a request failed at a backend: a 5xx answer, no first byte in time, a connection reset or
# closed mid-answer, a stream idle past its timeout.
FAILURE_REASONS = frozenset({"status_5xx", "timeout", "reset", "stream_idle"})


@dataclass(slots=True)
class _Backend:
    spec: BackendSpec
    discovered_models: tuple[str, ...] | None = None
    snapshot: BackendSnapshot | None = None
    healthy: bool = False
    failures: int = 0  # consecutive
    held_until: float = 0.0  # a 429/503 Retry-After: no new traffic before then
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
        failure_threshold: int = 3,
    ) -> None:
        if max_snapshot_age <= 0:
            raise ValueError("max_snapshot_age must be positive")
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self._specs = tuple(specs)
        self._backends = {spec.id: _Backend(spec) for spec in self._specs}
        if len(self._backends) != len(self._specs):
            raise ValueError("backend ids must be unique")
        self.max_snapshot_age = max_snapshot_age
        self.failure_threshold = failure_threshold

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

    def healthy_models(self) -> list[str]:
        models: set[str] = set()
        for spec in self._specs:
            if self._backends[spec.id].healthy:
                models.update(self.models_of(spec.id))
        return sorted(models)

    # Health.

    def record_scrape(self, backend_id: str, snapshot: BackendSnapshot) -> None:
        """A successful scrape: the backend answered, so it is healthy; its snapshot is replaced
        unless the one held was taken later."""
        backend = self._backends[backend_id]
        if backend.snapshot is None or snapshot.taken_at >= backend.snapshot.taken_at:
            backend.snapshot = snapshot
        backend.healthy = True
        backend.failures = 0

    def record_failure(self, backend_id: str, now: float) -> None:
        """A failed scrape or connection. `now` is part of the contract; health counts failures
        in a row, not time."""
        backend = self._backends[backend_id]
        backend.failures += 1
        if backend.failures >= self.failure_threshold:
            backend.healthy = False

    def record_success(self, backend_id: str, now: float) -> None:
        """A successful call that is not a scrape (discovery, a proxied request)."""
        backend = self._backends[backend_id]
        backend.healthy = True
        backend.failures = 0

    # What requests' outcomes say (the relay's reports; scrapes report above).

    def record_request_success(self, backend_id: str, now: float) -> None:
        """A backend answered a request (any status below 500 but 429, or a whole stream)."""
        self.record_success(backend_id, now)

    def record_request_failure(self, backend_id: str, now: float, reason: str) -> None:
        """A request failed at the backend: `reason` is one of FAILURE_REASONS. Never a 4xx,
        never a client disconnect."""
        if reason not in FAILURE_REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        self.record_failure(backend_id, now)

    def record_unreachable(self, backend_id: str, now: float) -> None:
        """A connection to the backend was refused or could not be made."""
        self.record_failure(backend_id, now)

    def hold_off(self, backend_id: str, until: float) -> None:
        """The backend asked for no traffic before `until` (a 429 or 503 with Retry-After): it
        is no candidate until then, without being counted unhealthy."""
        backend = self._backends[backend_id]
        backend.held_until = max(backend.held_until, until)

    def held_until(self, backend_id: str) -> float:
        return self._backends[backend_id].held_until

    def is_healthy(self, backend_id: str) -> bool:
        return self._backends[backend_id].healthy

    def consecutive_failures(self, backend_id: str) -> int:
        return self._backends[backend_id].failures

    # Routing.

    def lease(self, backend_id: str, blocks: int, now: float) -> Lease:
        """The ledger entry of one request to `backend_id`, counted from entering the lease
        (the dispatch) to leaving it. `blocks`: KV blocks it is expected to hold."""
        return Lease(self._backends[backend_id].ledger, blocks, now)

    def candidate(self, backend_id: str, now: float) -> Candidate:
        return self._candidate(self._backends[backend_id], now)

    def _candidate(self, backend: _Backend, now: float) -> Candidate:
        ledger = backend.ledger
        snapshot = backend.snapshot
        # snapshot.is_stale, inlined: this runs for every backend at every decision.
        stale = snapshot is None or now - snapshot.taken_at > self.max_snapshot_age
        view = backend.view
        if (view is not None and view.snapshot is snapshot and view.stale == stale
                and view.healthy == backend.healthy and backend.view_version == ledger.version):
            return view
        inflight, reserved = ledger.inflight, ledger.reserved_blocks
        if snapshot is None:
            view = Candidate(backend.spec, backend.healthy, None, True, inflight, reserved,
                             inflight, reserved)
        else:
            since, blocks = ledger.since(snapshot.taken_at)
            view = Candidate(backend.spec, backend.healthy, snapshot, stale, inflight, reserved,
                             since, blocks)
        backend.view, backend.view_version = view, ledger.version
        return view

    def candidates(self, model: str | None, now: float) -> list[Candidate]:
        """Healthy backends serving `model` (any model when None), in configuration order;
        a backend held off (`hold_off`) is none until its time has passed."""
        out: list[Candidate] = []
        for backend in self._backends.values():  # configuration order
            if (backend.healthy and backend.held_until <= now
                    and (model is None or model in self._models(backend))):
                out.append(self._candidate(backend, now))
        return out

    def admin_rows(self, now: float) -> list[dict[str, object]]:
        """One row per backend, the fields `GET /admin/backends` documents (README.md); a figure
        nobody reported is None (JSON null)."""
        rows: list[dict[str, object]] = []
        for spec in self._specs:
            c = self.candidate(spec.id, now)
            snap = c.snapshot
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
                "consecutive_failures": self._backends[spec.id].failures,
            })
        return rows


def effective_free_blocks(candidate: Candidate) -> int | None:
    """KV blocks a new request can expect to find free, by the module docstring's rule."""
    snapshot = candidate.snapshot
    if snapshot is None or snapshot.kv_free_blocks is None:
        return None
    free = snapshot.kv_free_blocks - candidate.blocks_since_scrape
    if candidate.stale and snapshot.kv_total_blocks is not None:
        free = min(free, snapshot.kv_total_blocks - candidate.reserved_blocks)
    return max(0, free)
