"""The filters, scorers and pickers that policies are composed of (beyond routing/policy.py's
HealthyFilter, RoundRobinPicker and MaxScorePicker).

Every scorer returns a value in [0, 1], higher is better, for one candidate; figures relative to
the other candidates come from the decision's `RouteContext` (routing/context.py). A scorer that
needs a context and gets none (a Router called directly, without a Dispatcher) has nothing to go
by and scores every backend 0, so the remaining scorers and the picker decide.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from routing.context import RouteContext, kv_utilization, queue_depth
from routing.policy import RouteRequest, Scored
from routing.prefix import HashRing
from routing.state import Candidate

UNKNOWN_KV_SCORE = 0.5  # a backend that reports no KV figure is neither favoured nor shunned
DEFAULT_TTFT_TARGET_S = 1.0  # the usual time-to-first-token SLO
DEFAULT_TPOT_TARGET_S = 0.05  # the usual time-per-output-token SLO


class HighWaterFilter:
    """Drops backends that cannot take the request's KV without passing their high-water mark (or
    at too high a preemption risk): `RouteContext.admissible`. When none is admissible the
    admission step has already decided to send it anyway (too large for any backend, or admission
    off), so every candidate passes and the scorers decide."""

    def filter(self, request: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        ctx = request.context
        if ctx is None:
            return list(candidates)
        kept = [c for c in candidates if c.id in ctx.admissible]
        return kept or list(candidates)


class TtftScorer:
    """The best predicted TTFT in the pool over this backend's: 1 for the fastest, falling towards
    0 as the prediction grows; 0 for a backend that could never fit the prompt."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        pred = ctx.predictions.get(candidate.id) if ctx is not None else None
        if ctx is None or pred is None or not math.isfinite(pred.predicted_ttft_s):
            return 0.0
        if pred.predicted_ttft_s <= 0.0:
            return 1.0
        return ctx.best_ttft_s / pred.predicted_ttft_s


def _meets(predicted_s: float, log_target: float, scale: float) -> float:
    """P(actual <= target) when actual scatters log-normally around `predicted_s` (`scale`:
    sigma of log(actual / predicted) times sqrt 2)."""
    if predicted_s <= 0.0:
        return 1.0
    if not math.isfinite(predicted_s):
        return 0.0
    return 0.5 * math.erfc((math.log(predicted_s) - log_target) / scale)


class GoodputScorer:
    """The expected change in requests meeting both SLOs (goodput counts exactly those) if this
    backend takes the request:
        gain = P(TTFT <= ttft target) x P(TPOT <= tpot target | this request there)
               - (sequences there) x (P(their TPOT meets it) before - after)
    scored 1 / (2 - gain): 1 for a sure success that costs nobody theirs, 1/2 for a sure miss
    that costs nobody, towards 0 as the misses it causes grow (never flat, so the least harmful
    backend still wins when the request cannot succeed anywhere). Predictions scatter
    log-normally around the truth (`ttft_spread`, `tpot_spread`: sigma of log(actual /
    predicted)). The TPOT a decode sees is stretched by every prefill interleaved with it, so a
    long prompt costs the replies already decoding on a backend: a fast backend near the TPOT
    target loses to a slower one with room, and a slow backend whose TTFT would miss loses
    whatever its TPOT."""

    def __init__(self, ttft_target_s: float = DEFAULT_TTFT_TARGET_S,
                 tpot_target_s: float = DEFAULT_TPOT_TARGET_S, *, ttft_spread: float = 0.5,
                 tpot_spread: float = 0.35) -> None:
        if not min(ttft_target_s, tpot_target_s, ttft_spread, tpot_spread) > 0.0:
            raise ValueError("the SLO targets and spreads must be > 0")
        self._ttft = (math.log(ttft_target_s), ttft_spread * math.sqrt(2.0))
        self._tpot = (math.log(tpot_target_s), tpot_spread * math.sqrt(2.0))

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        pred = ctx.predictions.get(candidate.id) if ctx is not None else None
        if pred is None:
            return 0.0
        after = _meets(pred.predicted_tpot_s, *self._tpot)
        own = _meets(pred.predicted_ttft_s, *self._ttft) * after
        others = _meets(pred.tpot_others_s, *self._tpot)
        lost = max(0.0, _meets(pred.tpot_before_s, *self._tpot) - others) * max(
            0, pred.tpot_batch - 1)
        return 1.0 / (2.0 - own + lost)


class PrefillLoadScorer:
    """The share of the backend's time that its recent prefills, this prompt's included, leave
    to decoding: 1 - (uncached prompt tokens per second sent there) / (its prefill speed)
    (`Prediction.prefill_busy_after`). Interleaved prefill stretches every decode step there.
    On a mixed fleet the TTFT score alone would send the long prompts to the fastest prefill,
    loading those backends' steps until their TPOT and queue rise; this spreads the prefill load
    in proportion to each backend's prefill speed."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        pred = ctx.predictions.get(candidate.id) if ctx is not None else None
        return 0.0 if pred is None else max(0.0, 1.0 - pred.prefill_busy_after)


class PreemptionScorer:
    """One minus the predicted risk that admitting the request drives the backend to preempt."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        pred = ctx.predictions.get(candidate.id) if ctx is not None else None
        return 0.0 if pred is None else 1.0 - pred.preemption_risk


def _over_bound(ctx: RouteContext, candidate: Candidate, bound: float) -> bool:
    """Consistent hashing's bounded-load rule: one more request would put this backend above
    ceil(bound * (total in flight + 1) / backends)."""
    cap = math.ceil(bound * (ctx.inflight_total + 1) / max(1, ctx.pool_size))
    return candidate.inflight + 1 > cap


class PrefixAffinityScorer:
    """The fraction of the prompt's prefix blocks this backend likely holds in its cache.

    With `load_bound`, a backend above the bounded-load cap (see `_over_bound`) scores 0, so a hot
    prefix spills to other backends instead of piling onto one saturated backend."""

    def __init__(self, load_bound: float | None = None) -> None:
        self._bound = load_bound

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        if ctx is None or ctx.chain is None or not ctx.chain.blocks:
            return 0.0
        matched = ctx.matched_blocks.get(candidate.id, 0)
        if matched == 0 or (self._bound is not None and _over_bound(ctx, candidate, self._bound)):
            return 0.0
        return matched / len(ctx.chain.blocks)


class SessionAffinityScorer:
    """1 for the backend this request's session (user field or session header) last went to:
    a preference the other scorers can outweigh, never a pin."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        return 1.0 if ctx is not None and ctx.session_backend == candidate.id else 0.0


class LeastRequestScorer:
    """Fewer requests in flight from this gateway is better: 1 / (1 + in flight)."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        return 1.0 / (1.0 + candidate.inflight)


class QueueScorer:
    """The Inference Extension's queue scorer: the shortest waiting queue in the pool scores 1,
    the longest 0, linearly between; all equal scores 1."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        q = queue_depth(candidate)
        if ctx is None:
            return 1.0 / (1.0 + q)
        spread = ctx.queue_max - ctx.queue_min
        return 1.0 if spread <= 0.0 else (ctx.queue_max - q) / spread


class KvUtilizationScorer:
    """The Inference Extension's KV-cache scorer: the free fraction of the KV cache."""

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        used = kv_utilization(candidate)
        return UNKNOWN_KV_SCORE if used is None else 1.0 - used


class PrefixHashScorer:
    """Consistent hashing with bounded load: 1 for the backend the ring assigns the request's
    prefix key to (walking on past backends whose in-flight load would exceed `bound` x the mean),
    else 0.

    The key is the hash chain over the first `depth` prefix blocks (model and cache_salt
    included), so requests sharing that much prefix go to the same backend while it has room.
    The ring (the pool's backends, by configured weight) is rebuilt only when the pool changes;
    the pick is computed once per decision, cached against the decision's context."""

    def __init__(self, *, bound: float = 1.25, depth: int = 4) -> None:
        self._bound = bound
        self._depth = depth
        self._nodes: dict[str, float] = {}
        self._ring = HashRing(())
        self._ctx: RouteContext | None = None
        self._pick: str | None = None

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        ctx = request.context
        if ctx is None or ctx.chain is None:
            return 0.0
        if ctx is not self._ctx:
            if ctx.weights != self._nodes:
                self._nodes, self._ring = dict(ctx.weights), HashRing(ctx.weights)
            key = ctx.chain.key(self._depth)
            self._ctx, self._pick = ctx, self._ring.pick(key, ctx.inflight, bound=self._bound)
        return 1.0 if self._pick == candidate.id else 0.0


class RandomPicker:
    """Uniformly at random among the survivors, whatever their scores."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        return scored[0].candidate if len(scored) == 1 else self._rng.choice(scored).candidate


class PowerOfTwoPicker:
    """Two distinct survivors drawn at random; the higher-scored of the two (the first drawn on a
    tie). Near-least-loaded placement without herding onto the single least-loaded backend."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        if len(scored) == 1:
            return scored[0].candidate
        a, b = self._rng.sample(range(len(scored)), 2)
        return (scored[b] if scored[b].score > scored[a].score else scored[a]).candidate

