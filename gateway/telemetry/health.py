"""Backend health as metrics: ejections by reason, ejections the cap refused, and per-backend
gauges of ejected, held-off and reachable.

Like the state gauges (gateway/telemetry/gauges.py), these read a callback the gateway provides
(`HealthSource`) at collection time, a /metrics scrape, never on the request path. The counts are
the Fleet's own cumulative totals, so they are exported as observable counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from gateway.telemetry.labels import BACKEND

EJECTION_REASON = "kvgate.ejection.reason"  # the failure that made the ejection

_EMPTY: Mapping[str, bool] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class HealthReport:
    """Every backend's health at collection time, and the counts so far."""

    ejected: Mapping[str, bool] = field(default_factory=lambda: _EMPTY)  # by backend
    held: Mapping[str, bool] = field(default_factory=lambda: _EMPTY)
    reachable: Mapping[str, bool] = field(default_factory=lambda: _EMPTY)
    ejections: Mapping[tuple[str, str], int] = field(
        default_factory=lambda: MappingProxyType({}))  # (backend, reason) -> so far
    capped: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


HealthSource = Callable[[], HealthReport]

# (instrument name, description, which flags of the report)
_FLAGS: tuple[tuple[str, str, Callable[[HealthReport], Mapping[str, bool]]], ...] = (
    ("kvgate.backend.ejected", "1 while the backend is ejected for failing requests, else 0.",
     lambda report: report.ejected),
    ("kvgate.backend.held", "1 while the backend is held off by its own Retry-After, else 0.",
     lambda report: report.held),
    ("kvgate.backend.reachable", "0 while the backend refuses connections, else 1.",
     lambda report: report.reachable),
)  # fmt: skip


class HealthInstruments:
    """Creates the instruments once; `set_source` (re)points them at a callback."""

    def __init__(self, meter: Meter) -> None:
        self._source: HealthSource | None = None
        meter.create_observable_counter(
            "kvgate.backend.ejections", callbacks=[self._observe_ejections], unit="{ejection}",
            description="Backends ejected for failing requests in a row, by the failure that "
            "made the ejection (status_5xx, timeout, reset, stream_idle).")
        meter.create_observable_counter(
            "kvgate.backend.ejections_capped", callbacks=[self._observe_capped],
            unit="{ejection}",
            description="Ejections not made because the model's share of ejected backends was "
            "at health.max_ejected_fraction.")
        for name, description, read in _FLAGS:
            meter.create_observable_gauge(name, callbacks=[self._flag_callback(read)],
                                          unit="", description=description)

    def set_source(self, source: HealthSource) -> None:
        self._source = source

    def _report(self) -> HealthReport | None:
        return self._source() if self._source is not None else None

    def _observe_ejections(self, options: CallbackOptions) -> Iterator[Observation]:
        report = self._report()
        if report is not None:
            for (backend, reason), count in report.ejections.items():
                yield Observation(count, {BACKEND: backend, EJECTION_REASON: reason})

    def _observe_capped(self, options: CallbackOptions) -> Iterator[Observation]:
        report = self._report()
        if report is not None:
            for backend, count in report.capped.items():
                yield Observation(count, {BACKEND: backend})

    def _flag_callback(
        self, read: Callable[[HealthReport], Mapping[str, bool]]
    ) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            report = self._report()
            if report is not None:
                for backend, flag in read(report).items():
                    yield Observation(1.0 if flag else 0.0, {BACKEND: backend})

        return observe
