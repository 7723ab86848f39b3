"""Prometheus text exposition (format 0.0.4) rendered from the OpenTelemetry SDK's own collection.

`PrometheusReader` is a pull MetricReader: `render()` asks the MeterProvider to collect (which
also runs the observable gauges' callbacks) and renders the result. Naming follows the
OpenTelemetry → Prometheus compatibility rules: characters outside [a-zA-Z0-9_:] become "_", the
unit becomes a suffix (s → _seconds, a "1" gauge → _ratio, annotations in braces are dropped),
monotonic sums are counters ending in _total, non-monotonic sums are gauges, histograms get
cumulative _bucket{le=...} series ending in +Inf, plus _sum and _count.

The request histograms are not SDK instruments but `histograms.HistogramFamily` accumulators
(see there why); the reader is given them and renders them first, with the same naming rules.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    Metric,
    MetricReader,
    MetricsData,
    Sum,
)
from opentelemetry.util.types import AttributeValue

from gateway.telemetry.histograms import HistogramFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]+")
_ANNOTATION = re.compile(r"\{[^}]*\}")
_UNITS = {
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "min": "minutes",
    "h": "hours",
    "d": "days",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "%": "percent",
}
_PER_UNITS = {"s": "second", "min": "minute", "h": "hour", "d": "day"}


def _sanitize(name: str, pattern: re.Pattern[str]) -> str:
    clean = pattern.sub("_", name)
    return "_" + clean if clean[:1].isdigit() else clean


def unit_suffix(unit: str | None, prom_type: str) -> str:
    """The Prometheus name suffix for an OpenTelemetry (UCUM) unit; "" when there is none."""
    if not unit:
        return ""
    unit = _ANNOTATION.sub("", unit).strip()
    if unit == "1":
        return "ratio" if prom_type == "gauge" else ""
    if "/" in unit:
        num, _, per = unit.partition("/")
        head = _UNITS.get(num, num)
        tail = "per_" + _PER_UNITS.get(per, per) if per else ""
        unit = f"{head}_{tail}" if head and tail else head or tail
    else:
        unit = _UNITS.get(unit, unit)
    return _sanitize(unit, _INVALID_LABEL).strip("_") if unit else ""


def metric_name(name: str, unit: str | None, prom_type: str) -> str:
    """The exposed family name, e.g. ("gen_ai.server.request.duration", "s") → ..._seconds."""
    base = _sanitize(name, _INVALID_NAME)
    suffix = unit_suffix(unit, prom_type)
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    if prom_type == "counter" and not base.endswith("_total"):
        base += "_total"
    return base


def format_value(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_value(value: AttributeValue) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, int | float):
        text = format_value(value)
    else:  # kvgate records only scalar attributes; anything else is shown, not dropped
        text = str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@functools.lru_cache(maxsize=1024)
def _label_name(key: str) -> str:
    return _sanitize(key, _INVALID_LABEL)


def _label_pairs(attributes: Mapping[str, AttributeValue] | None) -> str:
    """`k="v",...` for one data point, rendered once and shared by all its lines."""
    if not attributes:
        return ""
    return ",".join(
        f'{_label_name(key)}="{_label_value(value)}"' for key, value in attributes.items()
    )


@dataclass(slots=True)
class _Family:
    prom_type: str
    help: str
    samples: list[str] = field(default_factory=list)


def _family_of(metric: Metric) -> tuple[str, str] | None:
    data = metric.data
    if isinstance(data, Histogram):
        return "histogram", metric_name(metric.name, metric.unit, "histogram")
    if isinstance(data, Sum):
        kind = "counter" if data.is_monotonic else "gauge"
        return kind, metric_name(metric.name, metric.unit, kind)
    if isinstance(data, Gauge):
        return "gauge", metric_name(metric.name, metric.unit, "gauge")
    # Exponential histograms: kvgate configures no view that makes one, and Prometheus' classic
    # text format has no place for them, so they are left out rather than rendered wrongly.
    return None


def _histogram_samples(
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    bounds: Sequence[float],
    bucket_counts: Sequence[int],
    total: float,
    count: int,
) -> Iterable[str]:
    pairs = _label_pairs(attributes)
    labels = "{" + pairs + "}" if pairs else ""
    prefix = "{" + pairs + "," if pairs else "{"
    cumulative = 0
    for bound, in_bucket in zip(bounds, bucket_counts, strict=False):
        cumulative += in_bucket
        yield f'{name}_bucket{prefix}le="{format_value(float(bound))}"}} {cumulative}'
    yield f'{name}_bucket{prefix}le="+Inf"}} {count}'
    yield f"{name}_sum{labels} {format_value(total)}"
    yield f"{name}_count{labels} {count}"


def _samples(name: str, metric: Metric) -> Iterable[str]:
    data = metric.data
    if isinstance(data, Histogram):
        for point in data.data_points:
            yield from _histogram_samples(
                name, point.attributes, point.explicit_bounds, point.bucket_counts, point.sum,
                point.count,
            )  # fmt: skip
    elif isinstance(data, Sum | Gauge):
        for number in data.data_points:
            pairs = _label_pairs(number.attributes)
            labels = "{" + pairs + "}" if pairs else ""
            yield f"{name}{labels} {format_value(number.value)}"


def render(data: MetricsData | None, histograms: Iterable[HistogramFamily] = ()) -> bytes:
    """Render `histograms`, then one SDK collection, as exposition text; families with the same
    name are merged. A histogram family nothing was recorded into is left out, as the SDK does."""
    families: dict[str, _Family] = {}
    for histogram in histograms:
        name = metric_name(histogram.name, histogram.unit, "histogram")
        for series in histogram.points():
            family = families.get(name)
            if family is None:
                family = families[name] = _Family("histogram", histogram.description)
            family.samples.extend(
                _histogram_samples(
                    name,
                    series.attributes,
                    series.bounds,
                    list(series.counts),
                    series.sum,
                    series.count,
                )  # fmt: skip
            )
    for resource_metrics in data.resource_metrics if data is not None else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = _family_of(metric)
                if kind is None:
                    continue
                prom_type, name = kind
                family = families.get(name)
                if family is None:
                    family = families[name] = _Family(prom_type, metric.description or "")
                family.samples.extend(_samples(name, metric))
    lines: list[str] = []
    for name, family in families.items():
        help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {family.prom_type}")
        lines.extend(family.samples)
    return ("\n".join(lines) + "\n").encode() if lines else b""


class PrometheusReader(MetricReader):
    """A pull reader: nothing is collected until `render()` is called. Cumulative temporality."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._latest: MetricsData | None = None
        self._histograms: tuple[HistogramFamily, ...] = ()

    def add_histograms(self, histograms: Sequence[HistogramFamily]) -> None:
        """Accumulators to render, before the SDK's instruments, with every collection."""
        self._histograms += tuple(histograms)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        self._latest = metrics_data

    def render(self) -> bytes:
        with self._lock:
            self.collect()
            data, self._latest = self._latest, None
        return render(data, self._histograms)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._latest = None
