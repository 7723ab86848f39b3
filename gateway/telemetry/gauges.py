"""Observable gauges fed by callbacks the gateway provides: per-backend state and queue depth.

The instruments exist from the start; the gateway registers its callbacks when it has a fleet and
an admission queue. The SDK calls each gauge's callback at collection time (a /metrics scrape),
never on the request path. A field a backend does not report is None and is left out of the
scrape, never invented.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from gateway.telemetry.labels import BACKEND


@dataclass(frozen=True, slots=True)
class BackendGauges:
    """One backend's state at scrape time, as the gateway knows it."""

    backend: str
    healthy: bool
    kv_usage: float | None = None  # fraction in [0, 1]
    kv_free_blocks: int | None = None
    running: int | None = None
    waiting: int | None = None
    poll_age_s: float | None = None  # age of the last successful scrape: staleness
    inflight: int | None = None  # the gateway's own ledger
    reserved_blocks: int | None = None


BackendGaugesSource = Callable[[], Iterable[BackendGauges]]
QueueDepthSource = Callable[[], int]

# (instrument name, unit, description, how to read the value from a row)
_BACKEND_GAUGES: tuple[tuple[str, str, str, Callable[[BackendGauges], float | None]], ...] = (
    ("kvgate.backend.healthy", "", "1 when the backend is healthy, else 0.",
     lambda row: 1.0 if row.healthy else 0.0),
    ("kvgate.backend.kv_usage", "1", "KV-cache usage reported by the backend, 0 to 1.",
     lambda row: row.kv_usage),
    ("kvgate.backend.kv_free_blocks", "{block}", "Free KV-cache blocks reported by the backend.",
     lambda row: row.kv_free_blocks),
    ("kvgate.backend.running", "{request}", "Sequences the backend reports running.",
     lambda row: row.running),
    ("kvgate.backend.waiting", "{request}", "Sequences the backend reports waiting.",
     lambda row: row.waiting),
    ("kvgate.backend.poll_age", "s", "Age of the backend's last successful scrape.",
     lambda row: row.poll_age_s),
    ("kvgate.backend.inflight", "{request}", "Requests the gateway has in flight there.",
     lambda row: row.inflight),
    ("kvgate.backend.reserved_blocks", "{block}",
     "KV blocks the gateway expects its in-flight requests there to hold.",
     lambda row: row.reserved_blocks),
)  # fmt: skip


class StateGauges:
    """Creates the observable gauges once; `set_*_source` (re)points them at a callback."""

    def __init__(self, meter: Meter) -> None:
        self._backends: BackendGaugesSource | None = None
        self._queue_depth: QueueDepthSource | None = None
        for name, unit, description, read in _BACKEND_GAUGES:
            meter.create_observable_gauge(
                name, callbacks=[self._backend_callback(read)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            "kvgate.queue.depth",
            callbacks=[self._observe_queue_depth],
            unit="{request}",
            description="Requests waiting in the gateway's admission queue.",
        )

    def set_backend_source(self, source: BackendGaugesSource) -> None:
        self._backends = source

    def set_queue_depth_source(self, source: QueueDepthSource) -> None:
        self._queue_depth = source

    def _backend_callback(
        self, read: Callable[[BackendGauges], float | None]
    ) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            if self._backends is None:
                return
            for row in self._backends():
                value = read(row)
                if value is not None:
                    yield Observation(value, {BACKEND: row.backend})

        return observe

    def _observe_queue_depth(self, options: CallbackOptions) -> Iterator[Observation]:
        if self._queue_depth is not None:
            yield Observation(self._queue_depth())
