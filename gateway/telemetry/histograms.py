"""Histograms pre-aggregated per label set: the request path's records, rendered at scrape time.

An OpenTelemetry SDK histogram validates, copies and hashes its attributes on every `record`
(several microseconds each), and a request records about six of them. Here a label set is
interned once, as a `Series` the caller keeps, and a record is a bisect and three additions.

The buckets are the SDK's explicit-bucket aggregation, exactly: bucket i counts the values in
(bounds[i-1], bounds[i]], the last one (bounds[-1], +Inf); counts and sum are cumulative since
start. `/metrics` renders these families directly (`prometheus.render`), in the same names,
units, labels and bounds the SDK instruments had. kvgate exports no metrics over OTLP (its OTLP
exporter is for spans), so no SDK histogram is kept alongside: a second copy would only cost.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence


class Series:
    """One label set's buckets, sum and count. Single-threaded, like the event loop."""

    __slots__ = ("attributes", "bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...], attributes: dict[str, str]) -> None:
        self.bounds = bounds
        self.attributes = attributes  # built once; the renderer reads it, nobody mutates it
        self.counts = [0] * (len(bounds) + 1)
        self.sum: float = 0
        self.count = 0

    def record(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class HistogramFamily:
    """A histogram over fixed label keys; an empty-string value leaves that label out."""

    __slots__ = ("bounds", "description", "keys", "name", "unit", "_series")

    def __init__(
        self,
        name: str,
        keys: Sequence[str],
        bounds: tuple[float, ...],
        *,
        unit: str,
        description: str,
    ) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.bounds = bounds
        self.keys = tuple(keys)
        self._series: dict[tuple[str, ...], Series] = {}

    def series(self, values: tuple[str, ...]) -> Series:
        """The series of `values` (lined up with the keys), created on first use."""
        series = self._series.get(values)
        if series is None:
            attributes = {key: value for key, value in zip(self.keys, values, strict=True) if value}
            series = self._series[values] = Series(self.bounds, attributes)
        return series

    def points(self) -> Iterator[Series]:
        """Every series recorded into so far (a series exists once something was recorded)."""
        return (series for series in list(self._series.values()) if series.count)
