"""The peers' routing rules as plugins, with their published defaults, so that kvgate's policies
can be compared with the gateways people run (routing/policies.py composes them).

- `CacheAwareScorer` (the SGLang router's and the vLLM router's `cache_aware`): when the load is
  imbalanced (max - min requests in flight > `balance_abs_threshold` AND max >
  `balance_rel_threshold` x min) the least loaded worker; otherwise the worker whose approximate
  tree (routing/scheduling/radix.py: the text it was sent, with eviction) matches the longest
  prefix of the request's text, if that match covers more than `cache_threshold` of the text;
  otherwise the worker with the smallest tree among those the tree holds text for (as the
  routers do: their per-worker character counts list only workers sent text, so at low
  concurrency every request goes to the first worker chosen until the load is imbalanced; a
  live run against both routers shows it, loadtest/bench_cache_aware_live.py). Its dispatch
  hook inserts the text into the chosen worker's tree. Load is the router's own count of
  requests in flight on each worker.
- `DynamoCostScorer` (NVIDIA Dynamo's KV router): cost = `overlap_score_weight` x the prompt
  blocks the worker would have to prefill (its uncached prompt) + its active KV blocks (decode
  load); lowest cost wins; `SoftmaxPicker` samples with `router_temperature` (0: the lowest).
- `ExactPrefixScorer` (llm-d's precise prefix-cache scorer): the prompt tokens each engine holds
  in its prefix cache, min-max normalised over the candidates, read from a `CacheView` of the
  engines' exact cache state (the simulation supplies one: loadtest/fleetsim/cache_view.py).
Dynamo's KV router also reads the engines' exact cache (its KV events), so it takes the view too.
Without a view both fall back to the gateway's own prefix index (`CycleState.matched`), as
Dynamo does without KV events.
Scores are in [0, 1], higher is better, so the Router's max-score picker picks the rule's choice
(ties at random). Pure, apart from the tree the cache-aware hook keeps.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from routing.load import kv_utilization
from routing.policy import Decision, Scored
from routing.prefix import PrefixChain
from routing.scheduling.cycle import CycleState
from routing.scheduling.facts import cached_tokens
from routing.scheduling.radix import DEFAULT_MAX_TREE_CHARS, ApproxTree
from routing.state import Candidate

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block of a backend that reports none (vLLM's default)


class CacheView(Protocol):
    """The engines' exact prefix-cache state: for one prompt (its chain and length), the prompt
    tokens each backend holds in its prefix cache now."""

    def cached_tokens(self, chain: PrefixChain, prompt_chars: int,
                      backend_ids: Sequence[str]) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class CacheAwareParams:
    """The SGLang router's defaults (its --balance-abs-threshold, --balance-rel-threshold,
    --cache-threshold and --max-tree-size)."""

    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    cache_threshold: float = 0.3
    max_tree_chars: int = DEFAULT_MAX_TREE_CHARS

    def __post_init__(self) -> None:
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance thresholds must be >= 0 (absolute) and >= 1 (relative)")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class DynamoParams:
    """Dynamo's KV router defaults (--kv-overlap-score-weight, --router-temperature)."""

    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.overlap_score_weight < 0 or self.router_temperature < 0:
            raise ValueError("overlap_score_weight and router_temperature must be >= 0")


def imbalanced(loads: Sequence[float], params: CacheAwareParams) -> bool:
    """The cache-aware rule's imbalance test over the workers' loads."""
    if not loads:
        return False
    high, low = max(loads), min(loads)
    return high - low > params.balance_abs_threshold and high > params.balance_rel_threshold * low


def _lowest_best(values: Sequence[float]) -> list[float]:
    """Min-max scores where the lowest value scores 1, the highest 0 (all 1 when equal)."""
    high, low = max(values), min(values)
    spread = high - low
    if spread <= 0.0:
        return [1.0] * len(values)
    return [(high - v) / spread for v in values]


def _smallest_known_tree(sizes: Sequence[int]) -> list[float]:
    """The routers' smallest-tree rule: the smallest among the workers their tree holds text for
    (a worker sent nothing yet is no tenant of the tree, so it is not chosen here: only the
    imbalance rule brings it in); any worker alike while the tree holds nothing."""
    known = [size for size in sizes if size > 0]
    if not known:
        return [1.0] * len(sizes)
    low, high = min(known), max(known)
    spread = high - low
    return [0.0 if size <= 0 else 1.0 if spread <= 0 else 1.0 - (size - low) / spread
            for size in sizes]


class CacheAwareScorer:
    def __init__(self, params: CacheAwareParams | None = None) -> None:
        self.params = params or CacheAwareParams()
        self.tree = ApproxTree(self.params.max_tree_chars)

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        loads = [float(c.inflight) for c in candidates]
        if imbalanced(loads, self.params):
            return _lowest_best(loads)
        chain = cycle.chain
        if chain is not None and chain.blocks:
            tree = self.tree
            matched = [tree.matched_chars(c.spec.id, chain) for c in candidates]
            best = max(matched)
            text = max(1, cycle.cost.prompt_chars)
            if best > 0 and best / text > self.params.cache_threshold:
                return [1.0 if m == best else 0.0 for m in matched]
        return _smallest_known_tree([self.tree.size_chars(c.spec.id) for c in candidates])

    def dispatched(self, cycle: CycleState, decision: Decision) -> None:
        if cycle.chain is not None:
            self.tree.insert(decision.backend_id, cycle.chain)


def block_size_of(candidate: Candidate) -> int:
    snap = candidate.snapshot
    return snap.block_size if snap is not None and snap.block_size else DEFAULT_BLOCK_SIZE


def active_blocks(candidate: Candidate) -> float:
    """The KV blocks in use on the backend (its scrape plus what was sent since), or the
    gateway's reservations there when it reports no KV figure."""
    used = kv_utilization(candidate)
    snap = candidate.snapshot
    if used is None or snap is None or not snap.kv_total_blocks:
        return float(candidate.reserved_blocks)
    return used * snap.kv_total_blocks


def cached_by(cycle: CycleState, candidates: list[Candidate], view: CacheView | None
              ) -> list[int]:
    """The prompt tokens each candidate holds cached: the exact view's figure, else the gateway's
    prefix index's guess."""
    chain = cycle.chain
    if chain is None or not chain.blocks and view is None:
        return [0] * len(candidates)
    if view is not None:
        held = view.cached_tokens(chain, cycle.cost.prompt_chars, [c.spec.id for c in candidates])
        return [min(cycle.prompt_tokens, held.get(c.spec.id, 0)) for c in candidates]
    matched = cycle.matched
    return [cached_tokens(cycle.cost, chain, matched.get(c.spec.id, 0)) for c in candidates]


def dynamo_costs(cycle: CycleState, candidates: list[Candidate], params: DynamoParams,
                 view: CacheView | None) -> list[float]:
    """Each candidate's Dynamo cost: weight x uncached prompt blocks + active blocks."""
    prompt = cycle.prompt_tokens
    out: list[float] = []
    for c, cached in zip(candidates, cached_by(cycle, candidates, view), strict=True):
        prefill_blocks = max(0, prompt - cached) / block_size_of(c)
        out.append(params.overlap_score_weight * prefill_blocks + active_blocks(c))
    return out


class DynamoCostScorer:
    def __init__(self, params: DynamoParams | None = None, view: CacheView | None = None
                 ) -> None:
        self.params = params or DynamoParams()
        self._view = view

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        return _lowest_best(dynamo_costs(cycle, candidates, self.params, self._view))


class ExactPrefixScorer:
    def __init__(self, view: CacheView | None = None) -> None:
        self._view = view

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        held = [float(t) for t in cached_by(cycle, candidates, self._view)]
        high, low = max(held), min(held)
        if high <= low:
            return [0.0] * len(candidates)
        return [(t - low) / (high - low) for t in held]


class SoftmaxPicker:
    """Dynamo's softmax sampling over the scores: temperature 0 is the highest score (ties at
    random); above 0, P(candidate) is proportional to exp(score / temperature) (scores are
    already min-max normalised, as Dynamo normalises its costs)."""

    def __init__(self, rng: random.Random, temperature: float = 0.0) -> None:
        self._rng = rng
        self._temperature = temperature

    def pick(self, scored: Sequence[Scored]) -> Candidate:
        if len(scored) == 1:
            return scored[0].candidate
        best = max(s.score for s in scored)
        if self._temperature <= 0.0:
            ties = [s.candidate for s in scored if s.score == best]
            return ties[0] if len(ties) == 1 else self._rng.choice(ties)
        weights = [math.exp((s.score - best) / self._temperature) for s in scored]
        return self._rng.choices([s.candidate for s in scored], weights=weights)[0]
