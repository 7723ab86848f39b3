"""Fleet planning: the cheapest fleet of the known GPUs that serves a request rate within a TTFT
and a TPOT SLO.

Pure: `plan_fleet(...)` takes a model, a request shape (mean prompt and output tokens, and the
longest request, which every replica must hold) and the SLOs, and returns a frozen `FleetPlan`.

Every deployment of the model is a candidate: each GPU type of `gpus`, tensor parallel over 1, 2,
4 or 8 of them (a divisor of the attention heads), in bf16 and, when `fp8` allows, with FP8
weights and KV cache. A candidate is kept when its weights and the longest request fit, its idle
TTFT meets the TTFT SLO, and some batch meets the TPOT SLO; its planned capacity is its SLO
capacity (`routing.plan`) times `max_load`, the share of it a replica runs at so that queueing
under random arrivals keeps the TTFT SLO (the steady-state model has no queue). The fleet is the
cheapest combination of at most two candidates whose planned capacities add up to the rate:
cheapest in $/h when `prices` ($ per GPU-hour by GPU type) are given, and then only over the
priced types; in GPUs otherwise. Ties go to the fleet of fewer replicas, then to one type.

With prices the plan gives the cost per million output tokens at the planned rate; with `power`
(watts per GPU by type) the fleet's draw and the energy per million output tokens. `backends`
names the fleet as `kvgate simulate --backends` takes it, to check the plan under real arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from routing.physics import GpuSpec, ModelSpec, deployment_name
from routing.plan import Plan, plan

TP_DEGREES = (1, 2, 4, 8)
MAX_LOAD = 0.8


@dataclass(frozen=True, slots=True)
class Candidate:
    gpu_key: str  # the GPU's name in `routing.physics.GPUS`
    gpus_per_replica: int
    fp8: bool
    replica: Plan
    capacity: float  # planned requests/s of one replica: SLO capacity x max_load

    @property
    def name(self) -> str:
        return deployment_name(self.replica.model.name, self.gpu_key, self.gpus_per_replica,
                               self.fp8)


@dataclass(frozen=True, slots=True)
class Group:
    """`replicas` replicas of one candidate."""

    candidate: Candidate
    replicas: int

    @property
    def gpus(self) -> int:
        return self.replicas * self.candidate.gpus_per_replica


@dataclass(frozen=True, slots=True)
class FleetPlan:
    model: ModelSpec
    rate: float
    prompt_tokens: int
    output_tokens: int
    tpot_slo_s: float
    ttft_slo_s: float
    max_load: float
    groups: tuple[Group, ...]  # empty when no candidate meets the SLOs
    candidates: tuple[Candidate, ...]  # every one kept, cheapest homogeneous fleet first
    cost_per_hour: float | None  # with prices
    power_w: float | None  # with power figures for every GPU type of the fleet
    warnings: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def replicas(self) -> int:
        return sum(g.replicas for g in self.groups)

    @property
    def capacity(self) -> float:
        return sum(g.replicas * g.candidate.capacity for g in self.groups)

    @property
    def backends(self) -> str:
        """The fleet as `kvgate simulate --backends` takes it."""
        return ",".join(f"{g.replicas}x{g.candidate.name}" for g in self.groups)

    @property
    def output_tokens_per_hour(self) -> float:
        return self.rate * self.output_tokens * 3600.0

    @property
    def cost_per_million_output_tokens(self) -> float | None:
        if self.cost_per_hour is None or not self.groups:
            return None
        return self.cost_per_hour / (self.output_tokens_per_hour / 1e6)

    @property
    def kwh_per_million_output_tokens(self) -> float | None:
        if self.power_w is None or not self.groups:
            return None
        return self.power_w / 1e3 / (self.output_tokens_per_hour / 1e6)


def candidates(model: ModelSpec, gpus: Mapping[str, GpuSpec], *, prompt_tokens: int,
               output_tokens: int, longest_tokens: int, tpot_slo_s: float, ttft_slo_s: float,
               fp8: Sequence[bool] = (False,), memory_utilization: float = 0.9,
               max_load: float = MAX_LOAD,
               tp_degrees: Sequence[int] = TP_DEGREES) -> list[Candidate]:
    """Every deployment that meets the SLOs (module docstring), in the order given."""
    out: list[Candidate] = []
    for key, gpu in gpus.items():
        for fp in fp8:
            for tp in tp_degrees:
                if model.num_attention_heads % tp:
                    continue
                try:
                    p = plan(model, gpu, gpus_per_replica=tp, prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens, rate=None, tpot_slo_s=tpot_slo_s,
                             ttft_slo_s=ttft_slo_s, memory_utilization=memory_utilization,
                             fp8=fp, longest_tokens=longest_tokens)
                except ValueError:
                    continue  # the weights or the longest request do not fit
                if p.slo is None or p.idle_ttft_s > ttft_slo_s:
                    continue
                out.append(Candidate(key, tp, fp, p, p.slo.requests_per_s * max_load))
    return out


def plan_fleet(model: ModelSpec, gpus: Mapping[str, GpuSpec], *, rate: float,
               prompt_tokens: int, output_tokens: int, longest_tokens: int | None = None,
               tpot_slo_s: float, ttft_slo_s: float, prices: Mapping[str, float] | None = None,
               power: Mapping[str, float] | None = None, fp8: Sequence[bool] = (False,),
               memory_utilization: float = 0.9, max_load: float = MAX_LOAD) -> FleetPlan:
    """The cheapest fleet for `rate` requests/s (module docstring); ValueError for a bad
    argument."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a finite number > 0, got {rate:g}")
    if not 0 < max_load <= 1:
        raise ValueError(f"max_load must be in (0, 1], got {max_load:g}")
    prices = dict(prices or {})
    unknown = sorted(set(prices) - set(gpus)) + sorted(set(power or {}) - set(gpus))
    if unknown:
        raise ValueError(f"unknown GPU {unknown[0]!r} in the prices or power; known: "
                         f"{', '.join(gpus)}")
    if prices:
        gpus = {k: g for k, g in gpus.items() if k in prices}
    longest = max(longest_tokens or 0, prompt_tokens + output_tokens)
    found = candidates(model, gpus, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                       longest_tokens=longest, tpot_slo_s=tpot_slo_s, ttft_slo_s=ttft_slo_s,
                       fp8=fp8, memory_utilization=memory_utilization, max_load=max_load)

    def unit(c: Candidate) -> float:  # what one replica costs
        return c.gpus_per_replica * (prices[c.gpu_key] if prices else 1.0)

    def needed(c: Candidate, r: float) -> int:
        return max(0, math.ceil(r / c.capacity - 1e-9))

    found.sort(key=lambda c: (needed(c, rate) * unit(c), needed(c, rate)))
    best: tuple[float, int, int, tuple[Group, ...]] | None = None
    for i, a in enumerate(found):
        for b in found[i:]:
            for n_a in range(needed(a, rate) + 1):
                n_b = needed(b, rate - n_a * a.capacity)
                groups = tuple(Group(c, n) for c, n in ((a, n_a), (b, n_b)) if n) if a is not b \
                    else (Group(a, n_a + n_b),)
                key = (sum(g.replicas * unit(g.candidate) for g in groups),
                       sum(g.replicas for g in groups), len(groups), groups)
                if best is None or key[:3] < best[:3]:
                    best = key
    groups = best[3] if best is not None else ()
    warnings: list[str] = []
    if not groups:
        warnings.append("no deployment of the GPUs considered meets both SLOs: relax the SLOs, "
                        "allow FP8, or give other GPU types")
    cost = sum(g.gpus * prices[g.candidate.gpu_key] for g in groups) if prices else None
    draw = None
    if power and groups and all(g.candidate.gpu_key in power for g in groups):
        draw = sum(g.gpus * power[g.candidate.gpu_key] for g in groups)
    return FleetPlan(model=model, rate=rate, prompt_tokens=prompt_tokens,
                     output_tokens=output_tokens, tpot_slo_s=tpot_slo_s, ttft_slo_s=ttft_slo_s,
                     max_load=max_load, groups=groups, candidates=tuple(found),
                     cost_per_hour=cost, power_w=draw, warnings=tuple(warnings))
