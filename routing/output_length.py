"""A model's reply-length distribution, learned from replies that ended and replies that were cut.

A reply that ended by itself (`finish_reason: stop`) is an observation of its natural length. A
reply that ended at its own `max_tokens` (`finish_reason: length`) is not: it says only that the
natural length was at least that long. Counting it as a sample teaches the model that replies are
as short as clients cut them, and the next request with a larger cap is under-reserved. So the
histogram keeps the two apart, per bucket, and reads the distribution as a Kaplan–Meier estimate
over the buckets: in each bucket the hazard is the ended weight over the weight still at risk (the
replies that ended there or later, and the replies cut there or later). A reply cut in a bucket
counts at risk through the whole of that bucket, so the estimate never puts its end below the cut.

Fixed buckets, four per octave from 1 to 131,072 tokens; weights decay with every observation (in
observations, not seconds: nothing here reads a clock), so the estimate follows a drifting
workload. A lognormal prior worth a few replies, decaying like them, keeps a tail above the
longest reply seen. The estimate and its prefix sums are recomputed (O(buckets)) at the first read
after each observation while the histogram is young (`WARM_UP` observations), then at the first
read after every `REFRESH_EVERY` of them: a lag of a few observations against a half-life of
hundreds, so that the estimate costs next to nothing per request. Quantiles and the moments a
request's cost needs are O(log buckets), cached per (max_tokens, min_tokens) until the next
refresh.

What one request will emit is its natural length bounded by its own cap and floor:
`clamp(T, min_tokens, max_tokens)`. `stats` gives that variable's quantiles and moments, and
`quantile_from` the quantile of the natural length given that a reply has already reached some
length (what a stream that outgrew its reservation re-reserves).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from itertools import accumulate
from operator import mul
from typing import NamedTuple

_PER_OCTAVE = 4
_OCTAVES = 17
# Bucket 0 holds empty replies; bucket j >= 1 covers [2**((j-1)/4), 2**(j/4)). Lengths past the top
# edge count in the last bucket.
EDGES: tuple[float, ...] = (0.0,) + tuple(
    2.0 ** (k / _PER_OCTAVE) for k in range(_OCTAVES * _PER_OCTAVE + 1)
)
BUCKETS = len(EDGES) - 1
REPS: tuple[float, ...] = (0.0,) + tuple(
    math.sqrt(EDGES[j] * EDGES[j + 1]) for j in range(1, BUCKETS)
)
DEFAULT_RESERVATION_QUANTILE = 0.9
WARM_UP = 64  # observations during which every one refreshes the estimate
REFRESH_EVERY = 16  # afterwards, observations per refresh


def bucket(tokens: float) -> int:
    if tokens < 1.0:
        return 0
    return min(BUCKETS - 1, 1 + int(math.log2(tokens) * _PER_OCTAVE))


class OutputStats(NamedTuple):
    """A reply-length distribution summarised for one request (token counts). A named tuple:
    one is made per request, and a tuple is built faster than a frozen dataclass."""

    p50: int  # quantiles of the reply this request will emit (natural length, clamped)
    p90: int
    mean: float  # its moments
    var: float
    mean_all: float  # unbounded mean natural length
    growth_mean: float  # see RequestCost.inflight_growth_mean
    growth_var: float
    reserve: int  # its quantile at the reservation quantile


class LengthHistogram:
    """A decayed, censoring-aware log histogram of reply lengths in tokens. One per model; not
    thread-safe."""

    __slots__ = ("_ended", "_cut", "_increment", "_decay", "_reserve_q", "_seen", "_pending",
                 "_weights", "_p0", "_p1", "_p2", "_p3", "_stats")

    def __init__(self, *, half_life: float, prior_median: float, prior_weight: float,
                 reservation_quantile: float = DEFAULT_RESERVATION_QUANTILE) -> None:
        """`half_life`: observations after which an old one weighs half. The prior is a lognormal
        (median `prior_median`, sigma 1) of ended replies worth `prior_weight` observations,
        decaying like them."""
        if half_life <= 0 or prior_median <= 0 or prior_weight <= 0:
            raise ValueError("half_life, prior_median and prior_weight must be > 0")
        if not 0.0 < reservation_quantile < 1.0:
            raise ValueError("the reservation quantile must be in (0, 1)")
        self._decay = 0.5 ** (1.0 / half_life)
        self._increment = 1.0
        self._reserve_q = reservation_quantile
        mu = math.log(prior_median)
        cdf = [0.5 * math.erfc(-(math.log(e) - mu) / math.sqrt(2.0)) for e in EDGES[1:]]
        cdf[-1] = 1.0
        lower = [0.0, *cdf[:-1]]
        self._ended = [prior_weight * (c - b) for c, b in zip(cdf, lower, strict=True)]
        self._cut = [0.0] * BUCKETS
        self._seen = 0  # observations so far
        self._pending = -1  # observations since the last refresh; -1: never refreshed
        self._weights: list[float] = []  # the estimated distribution, in observation weights
        self._p0: list[float] = []  # _pk[b] = sum over buckets j < b of weight * rep**k
        self._p1: list[float] = []
        self._p2: list[float] = []
        self._p3: list[float] = []
        self._stats: dict[tuple[int | None, int], OutputStats] = {}

    @property
    def reservation_quantile(self) -> float:
        return self._reserve_q

    def observe(self, tokens: int, *, censored: bool = False) -> None:
        """A reply of `tokens` tokens; `censored`: it was cut there (its natural length is at
        least that), not ended by itself."""
        # Decay by growing the weight of each new observation instead of shrinking all the old
        # ones: every figure read out is a ratio of sums, so only relative weights matter.
        self._increment /= self._decay
        j = bucket(tokens)
        (self._cut if censored else self._ended)[j] += self._increment
        if self._increment > 1e100:  # renormalise long before floats overflow
            scale = 1.0 / self._increment
            self._ended = [w * scale for w in self._ended]
            self._cut = [w * scale for w in self._cut]
            self._increment = 1.0
        self._seen += 1
        if self._pending >= 0:
            self._pending += 1

    def _fresh(self) -> None:
        """Refresh the estimate when one is due (module docstring)."""
        pending = self._pending
        if pending < 0 or (pending and (self._seen <= WARM_UP or pending >= REFRESH_EVERY)):
            self._sums()

    def _sums(self) -> None:
        ended, cut = self._ended, self._cut
        at_risk = list(accumulate(reversed([e + c for e, c in zip(ended, cut, strict=True)])))
        at_risk.reverse()  # at_risk[j]: the weight of replies that ended or were cut in j or later
        weights: list[float] = []
        append = weights.append
        surviving = at_risk[0]  # the estimated weight of natural lengths past the buckets so far
        for e, risk in zip(ended, at_risk, strict=True):
            if risk <= 0.0 or surviving <= 0.0:
                break
            share = surviving * e / risk
            append(share)
            surviving -= share
        weights += [0.0] * (BUCKETS - len(weights))
        weights[-1] += max(0.0, surviving)  # cut past every ended reply: the top bucket
        self._weights = weights
        w1 = list(map(mul, weights, REPS))
        w2 = list(map(mul, w1, REPS))
        w3 = list(map(mul, w2, REPS))
        self._p0 = list(accumulate(weights, initial=0.0))
        self._p1 = list(accumulate(w1, initial=0.0))
        self._p2 = list(accumulate(w2, initial=0.0))
        self._p3 = list(accumulate(w3, initial=0.0))
        self._pending = 0
        self._stats.clear()

    def _cdf(self, tokens: float) -> float:
        """The estimated fraction of natural lengths below `tokens` (log-interpolated)."""
        cum = self._p0
        j = bucket(tokens)
        if j == 0:
            return 0.0
        lo, hi = EDGES[j], EDGES[j + 1]
        frac = min(1.0, max(0.0, math.log(tokens / lo) / math.log(hi / lo)))
        return (cum[j] + frac * (cum[j + 1] - cum[j])) / cum[-1]

    def _inverse(self, fraction: float) -> float:
        cum = self._p0
        target = fraction * cum[-1]
        j = min(BUCKETS - 1, max(0, bisect_left(cum, target, 1) - 1))
        if j == 0:
            return 0.0
        w = cum[j + 1] - cum[j]
        frac = min(1.0, max(0.0, (target - cum[j]) / w)) if w > 0 else 0.0
        lo = EDGES[j]
        return lo * math.pow(EDGES[j + 1] / lo, frac)

    def quantile(self, q: float) -> float:
        """The natural length below which a fraction `q` of replies end."""
        self._fresh()
        return self._inverse(q)

    def quantile_from(self, q: float, reached: float) -> float:
        """The natural length below which a fraction `q` of the replies that reach `reached`
        tokens end (never below `reached`)."""
        self._fresh()
        below = self._cdf(reached) if reached >= 1.0 else 0.0
        return max(reached, self._inverse(below + q * (1.0 - below)))

    def stats(self, max_tokens: int | None, min_tokens: int = 0) -> OutputStats:
        """The figures one request's cost needs, for a reply `clamp(T, min_tokens, max_tokens)`
        (`max_tokens` None: no cap)."""
        self._fresh()
        key = (max_tokens, min_tokens)
        out = self._stats.get(key)
        if out is None:
            out = self._stats[key] = self._compute_stats(max_tokens, min_tokens)
        return out

    def _compute_stats(self, max_tokens: int | None, min_tokens: int) -> OutputStats:
        p0, p1, p2, p3 = self._p0, self._p1, self._p2, self._p3
        total, s1 = p0[-1], p1[-1]
        cap = math.inf if max_tokens is None else float(max_tokens)
        floor = min(float(max(0, min_tokens)), cap)

        def clamped(q: float) -> int:
            return math.ceil(min(max(self._inverse(q), floor), cap))

        p50, p90, reserve = clamped(0.5), clamped(0.9), clamped(self._reserve_q)
        # Buckets below a end before the floor (they emit the floor), buckets from b on reach the
        # cap (they emit the cap); those in between emit their own length.
        b = bisect_right(REPS, cap)
        a = min(b, bisect_right(REPS, floor)) if floor > 0.0 else 0
        low_w, high_w = p0[a], total - p0[b]
        mean = (floor * low_w + (p1[b] - p1[a]) + (cap * high_w if high_w else 0.0)) / total
        second = (floor * floor * low_w + (p2[b] - p2[a])
                  + (cap * cap * high_w if high_w else 0.0)) / total
        var = max(0.0, second - mean * mean)
        if floor >= cap:
            mean, var = cap, 0.0
        if s1 <= 0.0:
            return OutputStats(p50, p90, mean, var, 0.0, 0.0, 0.0, reserve)
        # A sequence seen running at a random instant is length-biased (weight w * m) and uniformly
        # far into its reply, so its remaining length is R = m * U. Over this reply's horizon of T
        # decode steps it grows by min(R, T): per bucket m/2 and m^2/3 when m <= T, else
        # T - T^2/(2m) and T^2 - 2T^3/(3m). Prefix sums make that O(log buckets).
        t = float(max(p90, math.ceil(mean)))
        b = bisect_right(REPS, t)
        over_w, over_m = total - p0[b], s1 - p1[b]
        g1 = (0.5 * p2[b] + t * over_m - 0.5 * t * t * over_w) / s1
        g2 = (p3[b] / 3.0 + t * t * over_m - (2.0 / 3.0) * t * t * t * over_w) / s1
        return OutputStats(p50, p90, mean, var, s1 / total, g1, max(0.0, g2 - g1 * g1), reserve)
