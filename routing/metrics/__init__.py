"""Backend metrics payloads → `BackendSnapshot`s. Pure: text in, frozen value out.

`parse_metrics` reads a Prometheus text payload in the configured format, or detects the format
from the series names, and returns one snapshot; a field the server does not expose is None.
llama.cpp's KV figures come from its `GET /slots` JSON: `parse_slots` then `with_slots`.
One module per server format; `prom` is the shared text parser.
"""

from __future__ import annotations

from routing.metrics import llamacpp, sglang, tgi, trtllm, vllm
from routing.metrics.detect import detect_family
from routing.metrics.llamacpp import Slots, parse_slots, with_slots
from routing.metrics.prom import MetricsError, parse_samples
from routing.state import METRICS_FORMATS, BackendSnapshot

__all__ = [
    "MetricsError",
    "Slots",
    "detect_family",
    "parse_metrics",
    "parse_slots",
    "with_slots",
]


def parse_metrics(
    text: str,
    *,
    taken_at: float,
    format: str | None = None,
    max_batch_total_tokens: int | None = None,
) -> BackendSnapshot:
    """One snapshot from a /metrics payload.

    `format` is one of `routing.state.METRICS_FORMATS`, or None to detect it. `taken_at` is the
    caller's monotonic time of the scrape. `max_batch_total_tokens` is TGI's configured batch
    budget (ignored by the other formats). Raises MetricsError for a payload that is not the
    format (garbage, an HTML error page, another server's metrics).
    """
    if format is not None and format not in METRICS_FORMATS:
        raise ValueError(f"unknown metrics format {format!r}")
    family = detect_family(text) if format is None else format
    if family in ("vllm", "vllm-v0"):
        return vllm.build(parse_samples(text, vllm.NAMES), taken_at=taken_at, variant=format)
    if family == "sglang":
        return sglang.build(parse_samples(text, sglang.NAMES), taken_at=taken_at)
    if family == "tgi":
        return tgi.build(
            parse_samples(text, tgi.NAMES),
            taken_at=taken_at,
            max_batch_total_tokens=max_batch_total_tokens,
        )
    if family == "trtllm":
        return trtllm.build(parse_samples(text, trtllm.NAMES), taken_at=taken_at)
    return llamacpp.build(parse_samples(text, llamacpp.NAMES), taken_at=taken_at)
