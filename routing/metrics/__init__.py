"""Backend metrics payloads → `BackendSnapshot`s. Pure: text in, frozen value out.

`parse_metrics` reads a Prometheus text payload in the configured format, or detects the format
from the series names, and returns one snapshot; a field the server does not expose is None.
llama.cpp's KV figures come from its `GET /slots` JSON: `parse_slots` then `with_slots`.

`parse_metrics` is two steps the poller takes apart: `read_metrics` cuts the series the format
reads out of the payload (a `Reading`), `snapshot_of` parses them into a snapshot; in between, the
poller completes a hot answer's reading with the slow groups of the last full one
(routing/metrics/query.py). A snapshot depends on the reading alone (and the configured batch
budget): equal readings give equal snapshots.

One module per server format; `prom` is the shared text reader. Each format module lists the
series it reads in the server's payload order (`NAMES`, and `TAIL` for those at the very end),
so that a current payload is crossed about once; names only older server versions write are
searched for only when the current ones are missing. A small payload is read in one regex pass
instead (`scan.SeriesReader`), with the same result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from routing.metrics import llamacpp, sglang, tgi, trtllm, vllm
from routing.metrics.detect import detect_family
from routing.metrics.llamacpp import Slots, parse_slots, with_slots
from routing.metrics.prom import Groups, MetricsError, Samples, parse_groups
from routing.state import METRICS_FORMATS, BackendSnapshot

__all__ = [
    "MetricsError",
    "Reading",
    "Slots",
    "detect_family",
    "parse_metrics",
    "parse_slots",
    "read_metrics",
    "rebuilt",
    "snapshot_of",
    "with_slots",
]

_READERS: dict[str, Callable[[bytes], Groups]] = {
    "vllm": vllm.read,
    "vllm-v0": vllm.read,
    "sglang": sglang.read,
    "tgi": tgi.read,
    "trtllm": trtllm.read,
    "llamacpp": llamacpp.read,
}

# Formats whose `build` reads some groups from their bytes only: the groups it parses.
_PARSED = {"vllm": vllm.PARSED, "vllm-v0": vllm.PARSED}


class Reading(NamedTuple):
    """The text of the series a snapshot is built from, and how to read it. Equal readings give
    equal snapshots (for the same `max_batch_total_tokens`)."""

    family: str  # the format family: configured, or detected ("vllm" for either variant)
    format: str | None  # as configured; None when detected
    groups: Groups


def parse_metrics(
    payload: bytes | str,
    *,
    taken_at: float,
    format: str | None = None,
    max_batch_total_tokens: int | None = None,
) -> BackendSnapshot:
    """One snapshot from a /metrics payload (the bytes as they came, or decoded text).

    `format` is one of `routing.state.METRICS_FORMATS`, or None to detect it. `taken_at` is the
    caller's monotonic time of the scrape. `max_batch_total_tokens` is TGI's configured batch
    budget (ignored by the other formats). Raises MetricsError for a payload that is not the
    format (garbage, an HTML error page, another server's metrics).
    """
    reading = read_metrics(payload, format=format)
    return snapshot_of(reading, taken_at=taken_at, max_batch_total_tokens=max_batch_total_tokens)


def read_metrics(payload: bytes | str, *, format: str | None = None) -> Reading:
    """The series of `payload` that the format reads (detected when `format` is None). Raises
    MetricsError when no server's load series are there. Bytes are read as they are (only the
    series read are decoded, as UTF-8), text is encoded first."""
    if format is not None and format not in METRICS_FORMATS:
        raise ValueError(f"unknown metrics format {format!r}")
    if isinstance(payload, str):
        payload = payload.encode()
    family = detect_family(payload) if format is None else format
    groups = _READERS[family](payload)
    if family == "tgi" and not tgi.has_load(groups):  # only when configured: detection needs them
        tgi.check_unbatched(payload)
    return Reading(family, format, groups)


def snapshot_of(
    reading: Reading,
    *,
    taken_at: float,
    max_batch_total_tokens: int | None = None,
) -> BackendSnapshot:
    """The snapshot of a reading (see `parse_metrics`). Raises MetricsError when the series the
    format needs are missing."""
    family = reading.family
    samples = parse_groups(reading.groups, _PARSED.get(family))
    if family in ("vllm", "vllm-v0"):
        return vllm.build(
            samples, taken_at=taken_at, variant=reading.format, groups=reading.groups)
    if family == "sglang":
        return sglang.build(samples, taken_at=taken_at)
    if family == "tgi":
        return tgi.build(
            samples, taken_at=taken_at, max_batch_total_tokens=max_batch_total_tokens
        )
    if family == "trtllm":
        return trtllm.build(samples, taken_at=taken_at)
    return llamacpp.build(samples, taken_at=taken_at)


# Formats whose snapshots can be re-made from new values of their load series alone.
_REBUILDERS = {"vllm": vllm.rebuild, "vllm-v0": vllm.rebuild}


def rebuilt(
    family: str, snapshot: BackendSnapshot, load: Samples, groups: Groups, *, taken_at: float
) -> BackendSnapshot | None:
    """The snapshot of a reading of `family` that differs from the one `snapshot` was made of
    (whose groups are `groups`) only in the values of its load series, whose samples are now
    `load` (routing/metrics/vllm.py `rebuild`); None for a format that cannot tell."""
    rebuild = _REBUILDERS.get(family)
    return None if rebuild is None else rebuild(snapshot, load, groups, taken_at=taken_at)
