"""The policy registry: every routing policy by name, each a composition of filters, scorers
(with named, overridable weights) and a picker.

- round_robin: rotation over the healthy candidates.
- random: uniform choice.
- least_request: fewest requests in flight from this gateway (least_request 1).
- power_of_two: two drawn at random, the one with fewer in flight (least_request 1).
- kv_util: the Gateway API Inference Extension's default: queue 2, kv_cache 2, prefix 3.
- prefix_hash: consistent hashing of the prefix with bounded load, 1.25 x mean (prefix_hash 1).
- cost (the default): KV high-water filter, then long prompts to slower backends
  (routing/offload.py), then a request to an idle backend whose speed is not measured yet
  (routing/probe.py); ttft 2, goodput 2, prefill_load 4.5, preemption 1, prefix 0.3
  (load-bounded), session 0.3.

`cost` predicts, per backend, what the request would see there and what it would do to the
requests already there (routing/ttft.py: a vLLM-like engine's step is the weights read, plus the
KV every decode reads, plus the prefill chunks interleaved; each backend's speed is learned from
its first tokens, then from the TPOTs the gateway measures, a backend not measured yet is taken
as slow until they prove otherwise, and the prefill queue ahead comes from what the gateway
itself sent there). It
drops backends the request would push past their KV high-water mark, then weighs
- ttft: the predicted time to first token against the pool's best (queued prefill ahead, own
  uncached prefill, wait for KV blocks, one step), and
- goodput: the expected change in requests meeting both SLOs (TTFT 1 s, TPOT 50 ms): this
  request's own chance, less the replies there its context and its prefill stall would push
  past the TPOT target. So long prompts are not packed onto the fastest-looking backends past
  the SLO, a slow backend is not given requests whose first token would come too late, and a
  request that cannot succeed anywhere goes where it costs others least, and
- prefill_load: the share of the backend's time its recent prefills leave to decoding. TTFT
  alone would send every long prompt to the fastest prefill; on a mixed fleet that loads the
  fast backends' steps with prefill until their TPOTs and queues rise, so prefill is spread in
  proportion to each backend's prefill speed;
prefix affinity and session affinity are preferences on top, the former bounded by load so a hot
prefix never piles onto one saturated backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from routing.offload import PrefillOffloadFilter
from routing.policy import (
    Filter,
    HealthyFilter,
    MaxScorePicker,
    Picker,
    PolicyContext,
    PolicyFactory,
    RoundRobinPicker,
    Router,
    Scorer,
    Weighted,
)
from routing.probe import SpeedProbeFilter
from routing.scorers import (
    GoodputScorer,
    HighWaterFilter,
    KvUtilizationScorer,
    LeastRequestScorer,
    PowerOfTwoPicker,
    PreemptionScorer,
    PrefillLoadScorer,
    PrefixAffinityScorer,
    PrefixHashScorer,
    QueueScorer,
    RandomPicker,
    SessionAffinityScorer,
    TtftScorer,
)

DEFAULT_POLICY = "cost"

# Named scorers of one policy, with their default weights, built fresh per Router.
ScorerSpecs = Mapping[str, tuple[Callable[[PolicyContext], Scorer], float]]


def _compose(
    name: str,
    ctx: PolicyContext,
    picker: Picker,
    scorers: ScorerSpecs,
    filters: tuple[Filter, ...] = (),
) -> Router:
    unknown = sorted(set(ctx.weights) - set(scorers))
    if unknown:
        known = ", ".join(sorted(scorers)) or "none"
        raise ValueError(f"policy {name!r} has no scorer {unknown[0]!r} (its scorers: {known})")
    weighted = tuple(
        Weighted(make(ctx), ctx.weights.get(key, default))
        for key, (make, default) in scorers.items()
    )
    return Router(name, filters=(HealthyFilter(), *filters), scorers=weighted, picker=picker)


def scorer_names(policy: str) -> tuple[str, ...]:
    """The weight names a policy accepts (empty for policies without scorers)."""
    return tuple(sorted(_SCORERS.get(policy, {})))


def _least_request(_: PolicyContext) -> Scorer:
    return LeastRequestScorer()


def _prefix_bounded(ctx: PolicyContext) -> Scorer:
    return PrefixAffinityScorer(load_bound=ctx.prefix_load_bound)


def _prefix_hash(ctx: PolicyContext) -> Scorer:
    return PrefixHashScorer(bound=ctx.prefix_load_bound, depth=ctx.hash_prefix_blocks)


_SCORERS: Mapping[str, ScorerSpecs] = MappingProxyType({
    "round_robin": {},
    "random": {},
    "least_request": {"least_request": (_least_request, 1.0)},
    "power_of_two": {"least_request": (_least_request, 1.0)},
    "kv_util": {
        "queue": (lambda _: QueueScorer(), 2.0),
        "kv_cache": (lambda _: KvUtilizationScorer(), 2.0),
        "prefix": (lambda _: PrefixAffinityScorer(), 3.0),
    },
    "prefix_hash": {"prefix_hash": (_prefix_hash, 1.0)},
    "cost": {
        "ttft": (lambda _: TtftScorer(), 2.0),
        "goodput": (lambda _: GoodputScorer(), 2.0),
        "prefill_load": (lambda _: PrefillLoadScorer(), 4.5),
        "preemption": (lambda _: PreemptionScorer(), 1.0),
        "prefix": (_prefix_bounded, 0.3),
        "session": (lambda _: SessionAffinityScorer(), 0.3),
    },
})


def _round_robin(ctx: PolicyContext) -> Router:
    return _compose("round_robin", ctx, RoundRobinPicker(ctx.rng), _SCORERS["round_robin"])


def _random(ctx: PolicyContext) -> Router:
    return _compose("random", ctx, RandomPicker(ctx.rng), _SCORERS["random"])


def _least_request_policy(ctx: PolicyContext) -> Router:
    return _compose("least_request", ctx, MaxScorePicker(ctx.rng), _SCORERS["least_request"])


def _power_of_two(ctx: PolicyContext) -> Router:
    return _compose("power_of_two", ctx, PowerOfTwoPicker(ctx.rng), _SCORERS["power_of_two"])


def _kv_util(ctx: PolicyContext) -> Router:
    return _compose("kv_util", ctx, MaxScorePicker(ctx.rng), _SCORERS["kv_util"])


def _prefix_hash_policy(ctx: PolicyContext) -> Router:
    return _compose("prefix_hash", ctx, MaxScorePicker(ctx.rng), _SCORERS["prefix_hash"])


def _cost(ctx: PolicyContext) -> Router:
    filters: tuple[Filter, ...] = (HighWaterFilter(),)
    if ctx.offload_long_prompts:
        filters = (*filters, PrefillOffloadFilter())
    filters = (*filters, SpeedProbeFilter())
    return _compose("cost", ctx, MaxScorePicker(ctx.rng), _SCORERS["cost"], filters=filters)


# The one registry of policies by name.
POLICIES: Mapping[str, PolicyFactory] = MappingProxyType({
    "round_robin": _round_robin,
    "random": _random,
    "least_request": _least_request_policy,
    "power_of_two": _power_of_two,
    "kv_util": _kv_util,
    "prefix_hash": _prefix_hash_policy,
    "cost": _cost,
})
