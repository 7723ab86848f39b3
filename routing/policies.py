"""The policy registry: every routing policy by name, each a profile of named plugins (filters, then
scorers with named, overridable weights, then one picker), and the plugins by name.

- round_robin: rotation over the healthy candidates.
- random: uniform choice.
- least_request: fewest requests in flight from this gateway (least_request 1).
- power_of_two: two drawn at random, the one with fewer in flight (least_request 1).
- kv_util: the Gateway API Inference Extension's default: queue 2, kv_cache 2, prefix 3.
- prefix_hash: consistent hashing of the prefix with bounded load, 1.25 x mean (prefix_hash 1).
- cache_aware: the SGLang / vLLM router's cache-aware rule (routing/scheduling/peers.py): least
  loaded when imbalanced (abs 64, rel 1.5), else the longest prefix match above 0.3 of the text,
  else the smallest tree.
- dynamo_kv: NVIDIA Dynamo's KV router: lowest 1.0 x uncached prompt blocks + active blocks,
  softmax temperature 0.
- precise_prefix: llm-d's precise prefix-cache scorer 3 (the engines' exact cache, when a
  `cache_view` is given), kv_cache 2, queue 2.
- gie_default: kv_util under the Inference Extension's name (the same profile).
- least_kv: AIBrix's least-kv-cache: the least KV cache usage (kv_cache 1).
- cost (the default): KV high-water filter, then long prompts to slower backends
  (routing/scheduling/offload.py), then a request to an idle backend whose speed is not measured
  yet (routing/scheduling/probe.py); ttft 2, goodput 2, prefill_load 4.5, preemption 1, prefix
  0.3 (load-bounded), session 0.3.

`cost` reads the cycle's predictions (routing/predict.py: what the request would see on each
backend and what it would do to the requests already there) and weighs the predicted TTFT
against the pool's best, the expected change in requests meeting both SLOs (goodput), and the
share of each backend's time its recent prefills leave to decoding (TTFT alone would send every
long prompt to the fastest prefill, loading those backends' steps until their TPOTs rise);
prefix and session affinity are preferences on top, the former bounded by load so a hot prefix
never piles onto one saturated backend.

The load-based policies (cost, kv_util, least_request, power_of_two) read a backend whose
metrics are stale or missing by the gateway's ledger, as holding one request more than the ledger
says (routing/scheduling/ledger_view.py): preferred less at equal load, never left idle beside a
busy fresh backend; round_robin and random ignore load, so rotate over it anyway.

Every plugin's thresholds are typed parameters on `PolicyContext` (today's values as defaults);
the SLO targets are the gateway's one SLO. Callers build a Router with `build_router(name, ctx)`
and call it, never branching on a policy's name or class.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

from routing.policy import DispatchHook, Filter, Picker, Router, Scorer, Weighted
from routing.scheduling.affinity import (
    DEFAULT_HASH_BLOCKS,
    DEFAULT_LOAD_BOUND,
    PrefixAffinityScorer,
    PrefixHashScorer,
    SessionAffinityScorer,
)
from routing.scheduling.filters import HealthyFilter, HighWaterFilter
from routing.scheduling.goodput import GoodputParams, GoodputScorer
from routing.scheduling.latency import PreemptionScorer, PrefillLoadScorer, TtftScorer
from routing.scheduling.load_scorers import KvUtilizationScorer, LeastRequestScorer, QueueScorer
from routing.scheduling.offload import OffloadParams, PrefillOffloadFilter
from routing.scheduling.peers import (
    CacheAwareParams,
    CacheAwareScorer,
    CacheView,
    DynamoCostScorer,
    DynamoParams,
    ExactPrefixScorer,
    SoftmaxPicker,
)
from routing.scheduling.pickers import (
    MaxScorePicker,
    PowerOfTwoPicker,
    RandomPicker,
    RoundRobinPicker,
)
from routing.scheduling.probe import ProbeParams, SpeedProbeFilter
from routing.slo import SloTargets

DEFAULT_POLICY = "cost"


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy's plugins are built from: the injected Random and their typed parameters."""

    rng: random.Random = field(default_factory=random.Random)
    # Scorer weights by scorer name, overriding the policy's defaults; a name the policy does not
    # use is an error.
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    slo: SloTargets = field(default_factory=SloTargets)  # goodput's and the offload's targets
    prefix_load_bound: float = DEFAULT_LOAD_BOUND  # bounded-load factor for prefix affinity/hash
    hash_prefix_blocks: int = DEFAULT_HASH_BLOCKS  # prefix blocks that form prefix_hash's key
    offload_long_prompts: bool = True  # cost: long prompts to slower backends within the SLOs
    offload: OffloadParams = field(default_factory=OffloadParams)
    probe: ProbeParams = field(default_factory=ProbeParams)
    goodput: GoodputParams = field(default_factory=GoodputParams)
    cache_aware: CacheAwareParams = field(default_factory=CacheAwareParams)
    dynamo: DynamoParams = field(default_factory=DynamoParams)
    # The engines' exact prefix-cache state, where it is known (the fleet simulation's): read by
    # precise_prefix and dynamo_kv; without it they use the gateway's prefix index.
    cache_view: CacheView | None = None


# A filter plugin: the filter, and its learning hook if it has one; None: turned off by its
# parameters.
FilterPlugin = tuple[Filter, DispatchHook | None] | None


def _offload(ctx: PolicyContext) -> FilterPlugin:
    if not ctx.offload_long_prompts:
        return None
    plugin = PrefillOffloadFilter(ctx.slo, ctx.offload)
    return plugin, plugin


def _probe(ctx: PolicyContext) -> FilterPlugin:
    plugin = SpeedProbeFilter(ctx.probe)
    return plugin, plugin


FILTERS: Mapping[str, Callable[[PolicyContext], FilterPlugin]] = MappingProxyType({
    "healthy": lambda _: (HealthyFilter(), None),
    "high_water": lambda _: (HighWaterFilter(), None),
    "prefill_offload": _offload,
    "speed_probe": _probe,
})

SCORERS: Mapping[str, Callable[[PolicyContext], Scorer]] = MappingProxyType({
    "least_request": lambda _: LeastRequestScorer(),
    "queue": lambda _: QueueScorer(),
    "kv_cache": lambda _: KvUtilizationScorer(),
    "prefix": lambda _: PrefixAffinityScorer(),
    "prefix_bounded": lambda ctx: PrefixAffinityScorer(load_bound=ctx.prefix_load_bound),
    "prefix_hash": lambda ctx: PrefixHashScorer(bound=ctx.prefix_load_bound,
                                                depth=ctx.hash_prefix_blocks),
    "ttft": lambda _: TtftScorer(),
    "goodput": lambda ctx: GoodputScorer(ctx.slo, ctx.goodput),
    "prefill_load": lambda _: PrefillLoadScorer(),
    "preemption": lambda _: PreemptionScorer(),
    "session": lambda _: SessionAffinityScorer(),
    "cache_aware": lambda ctx: CacheAwareScorer(ctx.cache_aware),
    "dynamo_cost": lambda ctx: DynamoCostScorer(ctx.dynamo, ctx.cache_view),
    "precise_prefix": lambda ctx: ExactPrefixScorer(ctx.cache_view),
})

PICKERS: Mapping[str, Callable[[PolicyContext], Picker]] = MappingProxyType({
    "max_score": lambda ctx: MaxScorePicker(ctx.rng),
    "round_robin": lambda ctx: RoundRobinPicker(ctx.rng),
    "random": lambda ctx: RandomPicker(ctx.rng),
    "power_of_two": lambda ctx: PowerOfTwoPicker(ctx.rng),
    "softmax": lambda ctx: SoftmaxPicker(ctx.rng, ctx.dynamo.router_temperature),
})


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """One policy: filter plugins in order (after `healthy`), weight name -> (scorer plugin,
    default weight), and a picker."""

    picker: str
    scorers: Mapping[str, tuple[str, float]] = field(default_factory=dict)
    filters: tuple[str, ...] = ()


_GIE_DEFAULT = ProfileSpec("max_score", {"queue": ("queue", 2.0), "kv_cache": ("kv_cache", 2.0),
                                         "prefix": ("prefix", 3.0)})

# The one registry of policies by name: the baselines, the peers' policies, then kvgate's own.
PROFILES: Mapping[str, ProfileSpec] = MappingProxyType({
    "round_robin": ProfileSpec("round_robin"),
    "random": ProfileSpec("random"),
    "least_request": ProfileSpec("max_score", {"least_request": ("least_request", 1.0)}),
    "power_of_two": ProfileSpec("power_of_two", {"least_request": ("least_request", 1.0)}),
    "kv_util": _GIE_DEFAULT,
    "prefix_hash": ProfileSpec("max_score", {"prefix_hash": ("prefix_hash", 1.0)}),
    "cache_aware": ProfileSpec("max_score", {"cache_aware": ("cache_aware", 1.0)}),
    "dynamo_kv": ProfileSpec("softmax", {"dynamo_cost": ("dynamo_cost", 1.0)}),
    "precise_prefix": ProfileSpec(
        "max_score", {"precise_prefix": ("precise_prefix", 3.0), "kv_cache": ("kv_cache", 2.0),
                      "queue": ("queue", 2.0)}),
    "gie_default": _GIE_DEFAULT,
    "least_kv": ProfileSpec("max_score", {"kv_cache": ("kv_cache", 1.0)}),
    "cost": ProfileSpec(
        "max_score",
        {"ttft": ("ttft", 2.0), "goodput": ("goodput", 2.0),
         "prefill_load": ("prefill_load", 4.5), "preemption": ("preemption", 1.0),
         "prefix": ("prefix_bounded", 0.3), "session": ("session", 0.3)},
        filters=("high_water", "prefill_offload", "speed_probe")),
})
POLICIES = PROFILES


def policy_names() -> tuple[str, ...]:
    """Every registered policy."""
    return tuple(sorted(PROFILES))


def scorer_names(policy: str) -> tuple[str, ...]:
    """The weight names a policy accepts (empty for policies without scorers)."""
    spec = PROFILES.get(policy)
    return tuple(sorted(spec.scorers)) if spec is not None else ()


def build_router(name: str, ctx: PolicyContext) -> Router:
    """A fresh Router for the policy `name`; ValueError naming the known ones, or a weight the
    policy has no scorer for, otherwise."""
    try:
        spec = PROFILES[name]
    except KeyError as exc:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(policy_names())}") from exc
    unknown = sorted(set(ctx.weights) - set(spec.scorers))
    if unknown:
        known = ", ".join(sorted(spec.scorers)) or "none"
        raise ValueError(f"policy {name!r} has no scorer {unknown[0]!r} (its scorers: {known})")
    filters: list[Filter] = []
    hooks: list[DispatchHook] = []
    for plugin_name in ("healthy", *spec.filters):
        plugin = FILTERS[plugin_name](ctx)
        if plugin is not None:
            filters.append(plugin[0])
            if plugin[1] is not None:
                hooks.append(plugin[1])
    scorers = tuple(Weighted(SCORERS[plugin_name](ctx), ctx.weights.get(key, default))
                    for key, (plugin_name, default) in spec.scorers.items())
    # A scorer that learns from dispatches (cache_aware's tree) is its own hook.
    hooks += [cast(DispatchHook, w.scorer) for w in scorers if hasattr(w.scorer, "dispatched")]
    return Router(name, picker=PICKERS[spec.picker](ctx), filters=filters, scorers=scorers,
                  hooks=hooks)
