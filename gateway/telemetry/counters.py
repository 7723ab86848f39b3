"""Counters pre-aggregated in a dict and reported through an ObservableCounter.

A synchronous OpenTelemetry counter validates, copies and hashes its attributes on every `add`
(microseconds each); a request bumps several counters. Here the hot path is one dict update
keyed by a tuple of label values, and the SDK sees the cumulative totals once per collection. The
totals still live in, and are exported by, the one MeterProvider: this is its asynchronous
counter instrument, not a second metrics system.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from opentelemetry.metrics import CallbackOptions, Meter, Observation


class CounterSet:
    """A monotonic counter over fixed label keys; an empty-string value leaves that label out."""

    __slots__ = ("_attributes", "_counts", "_keys")

    def __init__(
        self, meter: Meter, name: str, keys: Sequence[str], *, unit: str, description: str
    ) -> None:
        self._keys = tuple(keys)
        self._counts: dict[tuple[str, ...], int] = {}
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}
        meter.create_observable_counter(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    def add(self, values: tuple[str, ...], amount: int = 1) -> None:
        """`values` lines up with the keys given at construction."""
        counts = self._counts
        if values in counts:
            counts[values] += amount
        else:
            self._attributes[values] = {
                key: value for key, value in zip(self._keys, values, strict=True) if value
            }
            counts[values] = amount

    def _observe(self, options: CallbackOptions) -> Iterator[Observation]:
        attributes = self._attributes
        for values, count in list(self._counts.items()):
            yield Observation(count, attributes[values])
