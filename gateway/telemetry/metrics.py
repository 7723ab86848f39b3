"""The per-request instruments and the one call that records a finished request into them.

Bucket boundaries are the GenAI semantic conventions' ExplicitBucketBoundaries advice for the
gen_ai.* histograms, and our own for the gateway queue. The hot path is `record`: one memo
lookup for the request's label set, a handful of histogram records (see `histograms`) and a few
dict increments (see `counters`) per request, nothing per chunk.

TTFT and TPOT are recorded for successful streamed responses only: without streaming the first
byte the client sees is the whole answer, and the conventions define both for successful
responses. The request duration is recorded for every request, with error.type on failures.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.metrics import Meter

import gateway.telemetry.labels as L
from gateway.telemetry.counters import CounterSet
from gateway.telemetry.histograms import HistogramFamily, Series
from gateway.telemetry.outcome import CACHE_MISS, RequestOutcome
from gateway.telemetry.timing import RequestTiming

TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
TPOT_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
REQUEST_DURATION_BUCKETS: tuple[float, ...] = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_USAGE_BUCKETS: tuple[float, ...] = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
# Gateway queue waits: most are ~0, a loaded fleet makes them seconds, the admission timeout caps
# them.
QUEUE_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
# How late the event loop ran its watch timer: under a few ms when idle or relaying, tens of ms
# when one step of work held it (a big body, a long decision), seconds when something blocked.
LOOP_LAG_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
SCORE_BUCKETS: tuple[float, ...] = tuple(i / 20 for i in range(1, 20))  # small-model scores

_HIT = "hit"
_MISS = "miss"
_INPUT = "input"
_OUTPUT = "output"


def cache_lookup_table(
    tiers: Sequence[str],
) -> dict[str, tuple[tuple[tuple[str, str], ...], str | None]]:
    """For each cache result: the (tier, hit|miss) lookups it implies, and the tier that hit.

    A lookup walks the tiers in order and stops at the first hit: "semantic" with tiers
    (exact, semantic) means one exact miss and one semantic hit. Built once; `record` indexes it.
    """
    table: dict[str, tuple[tuple[tuple[str, str], ...], str | None]] = {}
    misses: list[tuple[str, str]] = []
    for tier in tiers:
        table[tier] = ((*misses, (tier, _HIT)), tier)
        misses.append((tier, _MISS))
    table[CACHE_MISS] = (tuple(misses), None)
    return table


class _RequestSeries:
    """The histogram series one request label set records into, resolved once per label set."""

    __slots__ = ("backend", "duration", "errors", "input_tokens", "output_tokens", "tpot", "ttft",
                 "values")  # fmt: skip

    def __init__(self, metrics: RequestMetrics, values: tuple[str, ...]) -> None:
        self.values = values  # guarded (operation, request model, cache, response model, backend)
        self.backend = values[4]
        self.ttft = metrics.ttft.series(values)
        self.tpot = metrics.tpot.series(values)
        self.duration = metrics.duration.series((*values, ""))
        self.input_tokens = metrics.token_usage.series((*values, _INPUT))
        self.output_tokens = metrics.token_usage.series((*values, _OUTPUT))
        self.errors: dict[str, Series] = {}  # duration series by error.type, as met


# Raw label sets remembered → their series. A client can send any number of distinct model names,
# so the memo is bounded: past this many entries it starts over (the guard bounds the series).
_MAX_MEMO = 4096
_REQUEST_KEYS = (L.OPERATION, L.REQUEST_MODEL, L.CACHE_RESULT, L.RESPONSE_MODEL, L.BACKEND)


class RequestMetrics:
    """Creates the request instruments and records finished requests into them.

    The histograms are `HistogramFamily` accumulators (see `histograms`), listed in `histograms`
    for the Prometheus reader; the counters are `CounterSet`s on `meter`.
    """

    def __init__(self, meter: Meter, guard: L.LabelGuard, cache_tiers: Sequence[str]) -> None:
        self._guard = guard
        self._lookups = cache_lookup_table(cache_tiers)
        self._small = {True: ("true",), False: ("false",)}
        self._memo: dict[tuple[str, str, str, str | None, str | None], _RequestSeries] = {}
        self._queue_memo: dict[tuple[str, str], Series] = {}
        self.ttft = HistogramFamily(
            "gen_ai.server.time_to_first_token", _REQUEST_KEYS, TTFT_BUCKETS,
            unit="s",
            description="Arrival at the gateway to the first content byte sent to the client,"
            " gateway queue included, for successful streamed responses.",
        )  # fmt: skip
        self.tpot = HistogramFamily(
            "gen_ai.server.time_per_output_token", _REQUEST_KEYS, TPOT_BUCKETS,
            unit="s",
            description="Time per output token after the first, for successful streamed"
            " responses.",
        )  # fmt: skip
        self.duration = HistogramFamily(
            "gen_ai.server.request.duration", (*_REQUEST_KEYS, L.ERROR_TYPE),
            REQUEST_DURATION_BUCKETS,
            unit="s",
            description="Arrival at the gateway to the last byte sent to the client.",
        )  # fmt: skip
        self.token_usage = HistogramFamily(
            "gen_ai.client.token.usage", (*_REQUEST_KEYS, L.TOKEN_TYPE), TOKEN_USAGE_BUCKETS,
            unit="{token}",
            description="Input and output tokens per request, by gen_ai.token.type.",
        )  # fmt: skip
        self.queue_time = HistogramFamily(
            "kvgate.queue.time", (L.REQUEST_MODEL, L.ADMISSION_RESULT), QUEUE_BUCKETS,
            unit="s",
            description="Time a request waited in the gateway's admission queue.",
        )  # fmt: skip
        self.small_model_score = HistogramFamily(
            "kvgate.small_model.score", (L.REQUEST_MODEL, L.SMALL_MODEL_VERDICT), SCORE_BUCKETS,
            unit="1",
            description="The small-model classifier's scores (the probability a prompt is hard)"
            " by routing alias and verdict against the threshold in force.",
        )  # fmt: skip
        self.loop_lag = HistogramFamily(
            "kvgate.event_loop.lag", (), LOOP_LAG_BUCKETS,
            unit="s",
            description="How late the event loop ran a timer due every 25 ms: what every"
            " stream and scrape waited, on top of its own pace, while one step of work held"
            " the loop.",
        )  # fmt: skip
        self._loop_lag = self.loop_lag.series(())
        self.histograms: tuple[HistogramFamily, ...] = (
            self.ttft, self.tpot, self.duration, self.token_usage, self.queue_time,
            self.small_model_score, self.loop_lag,
        )  # fmt: skip
        self.admissions = CounterSet(
            meter, "kvgate.admission.decisions", (L.ADMISSION_RESULT, L.ADMISSION_REASON),
            unit="{request}",
            description="Admission decisions: admitted at once, queued then admitted, or"
            " rejected (with the reason).",
        )  # fmt: skip
        self.routing = CounterSet(
            meter, "kvgate.routing.decisions", (L.POLICY, L.BACKEND),
            unit="{request}",
            description="Requests routed, by policy and chosen backend.",
        )  # fmt: skip
        self.cache_lookups = CounterSet(
            meter, "kvgate.cache.lookups", (L.CACHE_TIER, L.LOOKUP_RESULT),
            unit="{lookup}",
            description="Cache lookups by tier and result (hit or miss).",
        )  # fmt: skip
        self.cache_tokens_saved = CounterSet(
            meter, "kvgate.cache.tokens_saved", (L.CACHE_TIER,),
            unit="{token}",
            description="Input plus output tokens served from the cache instead of a backend.",
        )  # fmt: skip
        self.small_model = CounterSet(
            meter, "kvgate.small_model.decisions", (L.SMALL_MODEL,),
            unit="{request}",
            description="Small-model routing decisions; the share of chosen=true is the"
            " small-model routing share.",
        )  # fmt: skip
        self.poll_errors = CounterSet(
            meter, "kvgate.backend.poll_errors", (L.BACKEND, L.POLL_ERROR),
            unit="{error}",
            description="Failed scrapes of a backend's load endpoint, by backend and error.",
        )  # fmt: skip
        self.retries = CounterSet(
            meter, "kvgate.retries", (L.RETRY_REASON,),
            unit="{retry}",
            description="Requests tried again on another backend after a failure before the"
            " first byte, by the failure (connect, reset, timeout, status_5xx, status_429).",
        )  # fmt: skip
        self.retry_budget_exhausted = CounterSet(
            meter, "kvgate.retry_budget.exhausted", (),
            unit="{request}",
            description="Failures returned as they were because the retry budget (20% of the"
            " requests in flight, at least 3 retries at once) was spent.",
        )  # fmt: skip

    def loop_lagged(self, seconds: float) -> None:
        self._loop_lag.record(seconds)

    def _series_of(self, outcome: RequestOutcome) -> _RequestSeries:
        raw = (
            outcome.operation, outcome.request_model, outcome.cache, outcome.response_model,
            outcome.backend,
        )  # fmt: skip
        memo = self._memo
        series = memo.get(raw)
        if series is None:
            guard = self._guard
            values = (
                guard(L.OPERATION, outcome.operation),
                guard(L.REQUEST_MODEL, outcome.request_model),
                guard(L.CACHE_RESULT, outcome.cache),
                "" if outcome.response_model is None
                else guard(L.RESPONSE_MODEL, outcome.response_model),
                "" if outcome.backend is None else guard(L.BACKEND, outcome.backend),
            )  # fmt: skip
            if len(memo) >= _MAX_MEMO:
                memo.clear()
            series = memo[raw] = _RequestSeries(self, values)
        return series

    def record(self, timing: RequestTiming, outcome: RequestOutcome) -> None:
        series = self._series_of(outcome)
        error = outcome.error_label
        if error is None and outcome.stream:
            ttft = timing.ttft_s
            if ttft is not None:
                series.ttft.record(ttft)
            # A cache hit's tokens are replayed at the gateway's pace, not generated: no TPOT.
            tpot = timing.tpot_s(outcome.output_tokens) if outcome.backend is not None else None
            if tpot is not None:
                series.tpot.record(tpot)
        duration = timing.duration_s
        if duration is not None:
            if error is None:
                series.duration.record(duration)
            else:
                failed = series.errors.get(error)
                if failed is None:
                    failed = series.errors[error] = self.duration.series(
                        (*series.values, self._guard(L.ERROR_TYPE, error))
                    )
                failed.record(duration)
        if outcome.input_tokens is not None:
            series.input_tokens.record(outcome.input_tokens)
        if outcome.output_tokens is not None:
            series.output_tokens.record(outcome.output_tokens)

        self._record_admission(timing, outcome)
        if outcome.backend is not None and outcome.policy is not None:
            self.routing.add((self._guard(L.POLICY, outcome.policy), series.backend))
        lookups = self._lookups.get(outcome.cache)
        if lookups is not None:
            for lookup in lookups[0]:
                self.cache_lookups.add(lookup)
            saved = (outcome.input_tokens or 0) + (outcome.output_tokens or 0)
            if lookups[1] is not None and saved:
                self.cache_tokens_saved.add((lookups[1],), saved)
        if outcome.small_model is not None:
            self.small_model.add(self._small[outcome.small_model])

    def _record_admission(self, timing: RequestTiming, outcome: RequestOutcome) -> None:
        if outcome.admission is None:
            return
        guard = self._guard
        result = guard(L.ADMISSION_RESULT, outcome.admission)
        reason = outcome.rejection_reason
        self.admissions.add((result, guard(L.ADMISSION_REASON, reason) if reason else ""))
        queue = timing.queue_s
        if queue is not None:
            raw = (outcome.request_model, outcome.admission)
            series = self._queue_memo.get(raw)
            if series is None:
                if len(self._queue_memo) >= _MAX_MEMO:
                    self._queue_memo.clear()
                series = self._queue_memo[raw] = self.queue_time.series(
                    (guard(L.REQUEST_MODEL, outcome.request_model), result)
                )
            series.record(queue)

    def retried(self, reason: str) -> None:
        self.retries.add((self._guard(L.RETRY_REASON, reason),))

    def small_model_scored(self, alias: str, verdict: str, score: float) -> None:
        guard = self._guard
        self.small_model_score.series(
            (guard(L.REQUEST_MODEL, alias), guard(L.SMALL_MODEL_VERDICT, verdict))).record(score)

    def poll_error(self, backend: str, error: str) -> None:
        guard = self._guard
        self.poll_errors.add((guard(L.BACKEND, backend), guard(L.POLL_ERROR, error)))
