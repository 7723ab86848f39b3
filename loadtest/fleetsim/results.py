"""One run's figures, from its per-request outcomes, and their spread over seeds.

Definitions (all over the requests that arrived in the run's window):
- TTFT: arrival at the gateway to the first token (gateway queue included); TPOT: (last token -
  first token) / (output tokens - 1), for replies of two tokens or more; end-to-end: arrival to
  the last token. Percentiles are nearest-rank over completed requests.
- goodput: completed requests per second of the arrival window that met BOTH SLOs (TTFT <=
  slo_ttft_s and, for replies of two tokens or more, TPOT <= slo_tpot_s).
- SLO misses: requests that did not meet both SLOs, refused ones included (requests - the
  completed ones goodput counts).
- output tokens/s: every delivered token over the makespan (start to the last completion).
- prefix-cache hit rate: prompt tokens served from the engines' prefix caches over prompt tokens
  queried, fleet-wide (vLLM's counters).
- reservation misses: completed requests whose reply needed more KV blocks than the gateway's
  lease reserved for it at dispatch (a stream then grows its lease as it goes).
- load imbalance: the hottest backend's time-averaged KV usage over the fleet's mean (1.0 is even;
  KV usage is a fraction of each backend's own capacity, so it compares unequal backends fairly).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from loadtest.fleetsim.loop import RequestOutcome, RunOutcome


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 1.0
    tpot_s: float = 0.05

    def __post_init__(self) -> None:
        if not self.ttft_s > 0 or not self.tpot_s > 0:
            raise ValueError("SLOs must be > 0")

    def ttft_missed(self, r: RequestOutcome) -> bool:
        return not r.ttft_s <= self.ttft_s

    def tpot_missed(self, tpot_s: float | None) -> bool:
        """A reply of fewer than two tokens has no TPOT (None) and cannot miss it."""
        return tpot_s is not None and not tpot_s <= self.tpot_s

    def met(self, r: RequestOutcome, tpot_s: float | None) -> bool:
        """Both SLOs met, what goodput counts; `tpot_s` is `r.tpot_s` (computed once by the
        caller, which needs it anyway)."""
        return not (self.ttft_missed(r) or self.tpot_missed(tpot_s))


@dataclass(frozen=True, slots=True)
class Summary:
    """One policy's figures in one run. Seconds, requests/s and fractions; None when undefined
    (a percentile with no completed request)."""

    requests: int
    completed: int
    rejected: int
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    e2e_p99_s: float | None
    output_tokens_per_s: float
    goodput_rps: float
    slo_misses: int
    preemptions: int
    reservation_misses: int
    prefix_hit_rate: float | None
    peak_queue: int
    load_imbalance: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {k: _round(v) for k, v in asdict(self).items()}


FIGURES: tuple[str, ...] = tuple(f.name for f in fields(Summary))


def _round(value: float | int | None) -> float | int | None:
    """Figures are rounded to 4 decimal places (0.1 ms for seconds) so that JSON is readable;
    rounding is deterministic, so the same run still gives the same JSON."""
    if value is None or isinstance(value, int):
        return value
    return round(value, 4)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(run: RunOutcome, slo: Slo) -> Summary:
    done = [r for r in run.requests if r.rejected is None]
    ttft = sorted(r.ttft_s for r in done)
    tpots = [r.tpot_s for r in done]
    tpot = sorted(t for t in tpots if t is not None)
    e2e = sorted(r.end_s - r.arrival_s for r in done)
    good = sum(1 for r, t in zip(done, tpots, strict=True) if slo.met(r, t))
    tokens = sum(r.output_tokens for r in done)
    queries = sum(b.prefix_queries_tokens for b in run.backends)
    hits = sum(b.prefix_hits_tokens for b in run.backends)
    usage = [b.mean_kv_usage for b in run.backends]
    mean_usage = sum(usage) / len(usage) if usage else 0.0
    return Summary(
        requests=len(run.requests),
        completed=len(done),
        rejected=len(run.requests) - len(done),
        ttft_p50_s=percentile(ttft, 0.50),
        ttft_p90_s=percentile(ttft, 0.90),
        ttft_p99_s=percentile(ttft, 0.99),
        tpot_p50_s=percentile(tpot, 0.50),
        tpot_p99_s=percentile(tpot, 0.99),
        e2e_p99_s=percentile(e2e, 0.99),
        output_tokens_per_s=tokens / run.makespan_s if run.makespan_s > 0 else 0.0,
        goodput_rps=good / run.duration_s,
        slo_misses=len(run.requests) - good,
        preemptions=sum(b.preemptions for b in run.backends),
        reservation_misses=sum(1 for r in done if r.reservation_missed),
        prefix_hit_rate=hits / queries if queries else None,
        peak_queue=run.peak_queue,
        load_imbalance=max(usage) / mean_usage if mean_usage > 0 else None,
    )


@dataclass(frozen=True, slots=True)
class Spread:
    """A figure over seeds: mean, min and max (None when a seed had no value)."""

    mean: float | None
    low: float | None
    high: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {"mean": _round(self.mean), "min": _round(self.low), "max": _round(self.high)}


def spread(summaries: Sequence[Summary]) -> dict[str, Spread]:
    """Every figure's spread over the runs (one per seed)."""
    out: dict[str, Spread] = {}
    for name in FIGURES:
        values = [getattr(s, name) for s in summaries]
        if not values or any(v is None for v in values):
            out[name] = Spread(None, None, None)
        else:
            nums = [float(v) for v in values]
            out[name] = Spread(sum(nums) / len(nums), min(nums), max(nums))
    return out
