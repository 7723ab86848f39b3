"""The figures `kvgate top` shows, from successive scrapes of the gateway's GET /metrics. Pure.

A histogram scrape is cumulative since the gateway started; the last minute's distribution is
the difference between two scrapes, bucket by bucket, and its quantiles are read from those
bucket deltas the way Prometheus' `histogram_quantile` does (linear within a bucket; a rank in
the +Inf bucket reads as the highest finite bound), except that observations summing to 0 read
as 0 (a queue nobody waited in). Counters are differenced the same way, and a
counter that went down means the gateway restarted: the newer scrape is then taken whole.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.telemetry.prometheus import metric_name

TTFT = metric_name("gen_ai.server.time_to_first_token", "s", "histogram")
TPOT = metric_name("gen_ai.server.time_per_output_token", "s", "histogram")
DURATION = metric_name("gen_ai.server.request.duration", "s", "histogram")
QUEUE_TIME = metric_name("kvgate.queue.time", "s", "histogram")
QUEUE_DEPTH = metric_name("kvgate.queue.depth", "{request}", "gauge")
CACHE_LOOKUPS = metric_name("kvgate.cache.lookups", "{lookup}", "counter")
SMALL_MODEL = metric_name("kvgate.small_model.decisions", "{request}", "counter")
ADMISSIONS = metric_name("kvgate.admission.decisions", "{request}", "counter")
RESULT_LABEL = "kvgate_admission_result"
REASON_LABEL = "kvgate_admission_reason"
_NO_REFUSALS: Mapping[str, float] = MappingProxyType({})
TIER_LABEL = "kvgate_cache_tier"
LOOKUP_LABEL = "kvgate_cache_lookup"
CHOSEN_LABEL = "kvgate_small_model_chosen"
SCORE = metric_name("kvgate.small_model.score", "1", "histogram")
ALIAS_LABEL = "gen_ai_request_model"
VERDICT_LABEL = "kvgate_small_model_verdict"
SCORE_BANDS = (0.2, 0.4, 0.6, 0.8)  # the bands' upper bounds; the last band runs to 1


@dataclass(frozen=True, slots=True)
class Sample:
    name: str  # the series name, with its _bucket/_sum/_count/_total suffix
    labels: Mapping[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """Samples of Prometheus text format 0.0.4; comments, blank and malformed lines are skipped."""
    samples: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        sample = _parse_line(line)
        if sample is not None:
            samples.append(sample)
    return samples


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_line(line: str) -> Sample | None:
    brace = line.find("{")
    space = line.find(" ")
    labels: dict[str, str] = {}
    if brace != -1 and (space == -1 or brace < space):
        name, i = line[:brace], brace + 1
        while True:
            while i < len(line) and line[i] in " ,":
                i += 1
            if i >= len(line):
                return None
            if line[i] == "}":
                rest = line[i + 1 :]
                break
            eq = line.find("=", i)
            if eq == -1 or eq + 1 >= len(line) or line[eq + 1] != '"':
                return None
            key, i = line[i:eq].strip(), eq + 2
            chars: list[str] = []
            while i < len(line) and line[i] != '"':
                if line[i] == "\\" and i + 1 < len(line):
                    i += 1
                    chars.append(_ESCAPES.get(line[i], "\\" + line[i]))
                else:
                    chars.append(line[i])
                i += 1
            if i >= len(line):
                return None
            labels[key] = "".join(chars)
            i += 1
    elif space != -1:
        name, rest = line[:space], line[space:]
    else:
        return None
    fields = rest.split()
    if not name or not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return Sample(name, labels, value)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative counts per upper bound (+Inf last), summed over every label set."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending le
    count: float
    total: float  # the sum of the observed values


EMPTY = Histogram((), 0.0, 0.0)


def histogram(samples: Iterable[Sample], family: str) -> Histogram:
    by_le: dict[float, float] = {}
    count = total = 0.0
    bucket, count_name, sum_name = family + "_bucket", family + "_count", family + "_sum"
    for s in samples:
        if s.name == bucket:
            le = float(s.labels.get("le", "nan"))
            if not math.isnan(le):
                by_le[le] = by_le.get(le, 0.0) + s.value
        elif s.name == count_name:
            count += s.value
        elif s.name == sum_name:
            total += s.value
    return Histogram(tuple(sorted(by_le.items())), count, total)


def histogram_delta(new: Histogram, old: Histogram) -> Histogram:
    """What was observed between two scrapes of the same histogram."""
    if new.count < old.count:  # reset: the gateway restarted in between
        return new
    before = dict(old.buckets)
    buckets = tuple((le, max(0.0, n - before.get(le, 0.0))) for le, n in new.buckets)
    return Histogram(buckets, new.count - old.count, new.total - old.total)


def quantile(q: float, hist: Histogram) -> float | None:
    """The q-quantile (0 < q < 1) of a (delta) histogram; None without observations. Observations
    that sum to 0 were all 0 (durations are never negative): no interpolation invents a wait."""
    if not hist.buckets:
        return None
    total = hist.buckets[-1][1]
    if total <= 0:
        return None
    if hist.total == 0:
        return 0.0
    rank = q * total
    lower, below = 0.0, 0.0
    for le, cumulative in hist.buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower  # the highest finite bound: the best a histogram can say
            if cumulative == below:
                return le
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def counter_sum(samples: Iterable[Sample], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def gauge_value(samples: Iterable[Sample], name: str) -> float | None:
    """The sum of a gauge's series, or None when the gateway exposes none."""
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


@dataclass(frozen=True, slots=True)
class AliasScores:
    """One routing alias's classifier scores: how many fell in each band of `SCORE_BANDS` (one
    more band than bounds), and how many were scored and judged easy."""

    bands: tuple[float, ...]
    scored: float
    easy: float

    @property
    def easy_share(self) -> float | None:
        return self.easy / self.scored if self.scored > 0 else None


_NO_SCORES: Mapping[str, AliasScores] = MappingProxyType({})


def scores_of(samples: Iterable[Sample]) -> dict[str, AliasScores]:
    """Each alias's score counts by band, from the score histogram's buckets."""
    at_bound: dict[str, list[float]] = {}
    scored: dict[str, float] = {}
    easy: dict[str, float] = {}
    bucket, count = SCORE + "_bucket", SCORE + "_count"
    for s in samples:
        alias = s.labels.get(ALIAS_LABEL, "")
        if s.name == count:
            scored[alias] = scored.get(alias, 0.0) + s.value
            if s.labels.get(VERDICT_LABEL) == "easy":
                easy[alias] = easy.get(alias, 0.0) + s.value
        elif s.name == bucket:
            le = float(s.labels.get("le", "nan"))
            cumulative = at_bound.setdefault(alias, [0.0] * len(SCORE_BANDS))
            for index, bound in enumerate(SCORE_BANDS):
                if math.isclose(le, bound, abs_tol=1e-9):
                    cumulative[index] += s.value
    out: dict[str, AliasScores] = {}
    for alias, total in scored.items():
        cumulative = [*at_bound.get(alias, [0.0] * len(SCORE_BANDS)), total]
        bands = tuple(b - a for a, b in zip([0.0, *cumulative], cumulative, strict=False))
        out[alias] = AliasScores(bands, total, easy.get(alias, 0.0))
    return out


def scores_delta(new: Mapping[str, AliasScores], old: Mapping[str, AliasScores]
                 ) -> dict[str, AliasScores]:
    """What each alias scored between two scrapes (an alias whose count went down restarted)."""
    out: dict[str, AliasScores] = {}
    for alias, now in new.items():
        before = old.get(alias)
        if before is None or now.scored < before.scored:
            delta = now
        else:
            delta = AliasScores(tuple(max(0.0, a - b) for a, b in zip(now.bands, before.bands,
                                                                        strict=True)),
                                now.scored - before.scored, max(0.0, now.easy - before.easy))
        if delta.scored > 0:
            out[alias] = delta
    return out


@dataclass(frozen=True, slots=True)
class Scrape:
    """The cumulative figures of one /metrics scrape that `top` differences."""

    at: float  # monotonic seconds of the scrape
    ttft: Histogram
    tpot: Histogram
    queue: Histogram
    requests: float
    cache_hits: float
    cache_lookups: float  # requests that looked the cache up: the first tier's lookups
    small_chosen: float
    small_decisions: float
    queue_depth: float | None
    refused: Mapping[str, float] = field(default_factory=lambda: _NO_REFUSALS)  # by reason
    scores: Mapping[str, AliasScores] = field(default_factory=lambda: _NO_SCORES)  # by alias


def scrape_of(samples: list[Sample], at: float) -> Scrape:
    lookups = [s for s in samples if s.name == CACHE_LOOKUPS]
    per_tier: dict[str, float] = {}
    for s in lookups:
        tier = s.labels.get(TIER_LABEL, "")
        per_tier[tier] = per_tier.get(tier, 0.0) + s.value
    small = SMALL_MODEL
    refused: dict[str, float] = {}
    for s in samples:
        if s.name == ADMISSIONS and s.labels.get(RESULT_LABEL) == "rejected":
            reason = s.labels.get(REASON_LABEL) or "unknown"
            refused[reason] = refused.get(reason, 0.0) + s.value
    return Scrape(
        at=at,
        ttft=histogram(samples, TTFT),
        tpot=histogram(samples, TPOT),
        queue=histogram(samples, QUEUE_TIME),
        requests=histogram(samples, DURATION).count,
        cache_hits=sum(s.value for s in lookups if s.labels.get(LOOKUP_LABEL) == "hit"),
        # Every lookup starts at the first tier and goes on only on a miss: it has the most.
        cache_lookups=max(per_tier.values(), default=0.0),
        small_chosen=counter_sum(samples, small, **{CHOSEN_LABEL: "true"}),
        small_decisions=counter_sum(samples, small),
        queue_depth=gauge_value(samples, QUEUE_DEPTH),
        refused=MappingProxyType(refused),
        scores=MappingProxyType(scores_of(samples)),
    )


@dataclass(frozen=True, slots=True)
class WindowStats:
    seconds: float | None  # the window's length; None = since the gateway started
    requests: float
    ttft: Histogram
    tpot: Histogram
    queue: Histogram
    cache_hit_rate: float | None  # None: no lookups in the window
    small_model_share: float | None  # None: no small-model decisions in the window
    queue_depth: float | None
    refused: Mapping[str, float] = field(default_factory=lambda: _NO_REFUSALS)  # by reason
    scores: Mapping[str, AliasScores] = field(default_factory=lambda: _NO_SCORES)  # by alias


def _diff(new: float, old: float) -> float:
    return new if new < old else new - old


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def window_stats(new: Scrape, old: Scrape | None) -> WindowStats:
    """The figures between `old` and `new`; with no `old`, everything since the gateway started."""
    if old is None:
        base = Scrape(new.at, EMPTY, EMPTY, EMPTY, 0.0, 0.0, 0.0, 0.0, 0.0, None)
    else:
        base = old
    return WindowStats(
        seconds=None if old is None else new.at - old.at,
        requests=_diff(new.requests, base.requests),
        ttft=histogram_delta(new.ttft, base.ttft),
        tpot=histogram_delta(new.tpot, base.tpot),
        queue=histogram_delta(new.queue, base.queue),
        cache_hit_rate=_ratio(
            _diff(new.cache_hits, base.cache_hits), _diff(new.cache_lookups, base.cache_lookups)
        ),
        small_model_share=_ratio(
            _diff(new.small_chosen, base.small_chosen),
            _diff(new.small_decisions, base.small_decisions),
        ),
        queue_depth=new.queue_depth,
        refused=MappingProxyType({
            reason: n for reason, count in new.refused.items()
            if (n := _diff(count, base.refused.get(reason, 0.0))) > 0}),
        scores=MappingProxyType(scores_delta(new.scores, base.scores)),
    )


class ScrapeWindow:
    """The scrapes of the last `span` seconds; `stats()` differences the newest and the oldest."""

    def __init__(self, span: float = 60.0) -> None:
        self._span = span
        self._scrapes: deque[Scrape] = deque()

    def add(self, scrape: Scrape) -> WindowStats:
        scrapes = self._scrapes
        scrapes.append(scrape)
        # Keep one scrape at or before the window's start, so the window spans all of it.
        while len(scrapes) > 2 and scrapes[1].at <= scrape.at - self._span:
            scrapes.popleft()
        oldest = scrapes[0]
        return window_stats(scrape, oldest if oldest is not scrape else None)
