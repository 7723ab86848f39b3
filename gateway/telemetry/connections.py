"""The client-connection instruments: open connections, refusals past the cap, connections cut
by the head or body deadline, and requests too malformed to parse.

The counts live in the gateway's connection book (gateway/connections.py), kept by the protocol
as connections come and go; the SDK reads them at collection time (a /metrics scrape), never on
the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

PHASE = "kvgate.phase"


class ConnectionCounts(Protocol):
    @property
    def open(self) -> int: ...
    @property
    def refused(self) -> int: ...
    @property
    def header_timeouts(self) -> int: ...
    @property
    def body_timeouts(self) -> int: ...
    @property
    def malformed(self) -> int: ...


class ConnectionInstruments:
    """Created once; `set_source` points them at the serving gateway's book."""

    def __init__(self, meter: Meter) -> None:
        self._book: ConnectionCounts | None = None
        meter.create_observable_gauge(
            "kvgate.client.connections", callbacks=[self._read(lambda b: b.open)],
            unit="{connection}", description="Client connections open now.")
        meter.create_observable_counter(
            "kvgate.client.connections_refused", callbacks=[self._read(lambda b: b.refused)],
            unit="{connection}",
            description="Client connections refused because max_connections were open.")
        meter.create_observable_counter(
            "kvgate.client.timeouts", callbacks=[self._observe_timeouts], unit="{connection}",
            description="Client connections closed because their request head or body did "
            "not arrive in time, by phase.")
        meter.create_observable_counter(
            "kvgate.client.malformed_requests", callbacks=[self._read(lambda b: b.malformed)],
            unit="{request}", description="Requests answered 400 because they could not be "
            "parsed as HTTP.")

    def set_source(self, book: ConnectionCounts) -> None:
        self._book = book

    def _read(self, value: Callable[[ConnectionCounts], int]
              ) -> Callable[[CallbackOptions], Iterator[Observation]]:
        def observe(options: CallbackOptions) -> Iterator[Observation]:
            if self._book is not None:
                yield Observation(value(self._book))

        return observe

    def _observe_timeouts(self, options: CallbackOptions) -> Iterator[Observation]:
        if self._book is not None:
            yield Observation(self._book.header_timeouts, {PHASE: "header"})
            yield Observation(self._book.body_timeouts, {PHASE: "body"})
