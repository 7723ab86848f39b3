"""The per-request instruments and the one call that records a finished request into them.

Bucket boundaries are the GenAI semantic conventions' ExplicitBucketBoundaries advice for the
gen_ai.* histograms, and our own for the gateway queue. The hot path is `record`: a handful of
histogram records and a few dict increments (see `counters`) per request, nothing per chunk.

TTFT and TPOT are recorded for successful streamed responses only: without streaming the first
byte the client sees is the whole answer, and the conventions define both for successful
responses. The request duration is recorded for every request, with error.type on failures.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.metrics import Meter

from gateway.telemetry import labels as L
from gateway.telemetry.counters import CounterSet
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


class RequestMetrics:
    """Creates the request instruments on `meter` and records finished requests into them."""

    def __init__(self, meter: Meter, guard: L.LabelGuard, cache_tiers: Sequence[str]) -> None:
        self._guard = guard
        self._lookups = cache_lookup_table(cache_tiers)
        self._small = {True: ("true",), False: ("false",)}
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Arrival at the gateway to the first content byte sent to the client,"
            " gateway queue included, for successful streamed responses.",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
        )
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token after the first, for successful streamed"
            " responses.",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS,
        )
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Arrival at the gateway to the last byte sent to the client.",
            explicit_bucket_boundaries_advisory=REQUEST_DURATION_BUCKETS,
        )
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Input and output tokens per request, by gen_ai.token.type.",
            explicit_bucket_boundaries_advisory=TOKEN_USAGE_BUCKETS,
        )
        self.queue_time = meter.create_histogram(
            "kvgate.queue.time",
            unit="s",
            description="Time a request waited in the gateway's admission queue.",
            explicit_bucket_boundaries_advisory=QUEUE_BUCKETS,
        )
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

    def record(self, timing: RequestTiming, outcome: RequestOutcome) -> None:
        guard = self._guard
        attrs: dict[str, str] = {
            L.OPERATION: guard(L.OPERATION, outcome.operation),
            L.REQUEST_MODEL: guard(L.REQUEST_MODEL, outcome.request_model),
            L.CACHE_RESULT: guard(L.CACHE_RESULT, outcome.cache),
        }
        if outcome.response_model is not None:
            attrs[L.RESPONSE_MODEL] = guard(L.RESPONSE_MODEL, outcome.response_model)
        if outcome.backend is not None:
            attrs[L.BACKEND] = guard(L.BACKEND, outcome.backend)

        error = outcome.error_label
        if error is None and outcome.stream:
            ttft = timing.ttft_s
            if ttft is not None:
                self.ttft.record(ttft, attrs)
            tpot = timing.tpot_s(outcome.output_tokens)
            if tpot is not None:
                self.tpot.record(tpot, attrs)
        duration = timing.duration_s
        if duration is not None:
            if error is None:
                self.duration.record(duration, attrs)
            else:
                self.duration.record(duration, {**attrs, L.ERROR_TYPE: guard(L.ERROR_TYPE, error)})
        if outcome.input_tokens is not None:
            self.token_usage.record(outcome.input_tokens, {**attrs, L.TOKEN_TYPE: _INPUT})
        if outcome.output_tokens is not None:
            self.token_usage.record(outcome.output_tokens, {**attrs, L.TOKEN_TYPE: _OUTPUT})

        self._record_admission(timing, outcome)
        if outcome.backend is not None and outcome.policy is not None:
            self.routing.add((guard(L.POLICY, outcome.policy), attrs[L.BACKEND]))
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
            self.queue_time.record(
                queue,
                {
                    L.REQUEST_MODEL: guard(L.REQUEST_MODEL, outcome.request_model),
                    L.ADMISSION_RESULT: result,
                },
            )

    def poll_error(self, backend: str, error: str) -> None:
        guard = self._guard
        self.poll_errors.add((guard(L.BACKEND, backend), guard(L.POLL_ERROR, error)))
