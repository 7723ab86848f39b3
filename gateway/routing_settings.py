"""The routing sections of the configuration: `routing` (the policy, admission and the gateway
queue, the scrapes), `slo` (the one SLO that admission, the goodput scorer and the long-prompt
offload all read) and `advanced` (expert knobs, each a trade best judged with `kvgate simulate`
in hand), and what the routing code is built from them (`policy_context`, `dispatch_config`).
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from routing.dispatch import DispatchConfig
from routing.policies import DEFAULT_POLICY, PolicyContext, policy_names
from routing.scheduling.goodput import GoodputParams
from routing.scheduling.offload import OffloadParams
from routing.scheduling.probe import ProbeParams
from routing.slo import SloTargets


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QueueSettings(_Section):
    """The gateway queue, per model: requests wait here, highest priority class first and fair
    between tenants, while no backend can take them under its KV high-water mark."""

    max_depth: int = Field(default=1024, ge=0,
                           description="Beyond this many waiting, 429 with Retry-After at once.")
    timeout_s: float = Field(default=30.0, gt=0,
                             description="Waiting longer answers 503 with Retry-After.")
    max_per_tenant: int | None = Field(
        default=None, ge=1,
        description="One tenant's share of the queue, at most; null: no per-tenant cap.")


# Keys of earlier versions' `routing` section and where they live now.
MOVED_ROUTING_KEYS = {
    "tpot_slo_s": "slo.tpot_s (null there is slo.admission: false)",
    "slo_wait_s": "advanced.slo_wait_s",
    "slo_exempt_priority": "slo.exempt_priority",
    "weights": "advanced.weights",
    "max_preemption_risk": "advanced.max_preemption_risk",
    "poll_group_size": "advanced.poll_group_size",
    "full_scrape_interval_s": "advanced.full_scrape_interval_s",
    "failure_threshold": "health.consecutive_failures (request failures: scrapes no longer "
                         "decide health)",
}


class RoutingSettings(_Section):
    """Which backend gets each request, when a request must wait or is refused, and how the
    backends' state is read."""

    policy: str = Field(
        default=DEFAULT_POLICY,
        description=f"The routing policy: one of {', '.join(policy_names())}.")
    admission: bool = Field(
        default=True,
        description="A backend takes a request only if its peak KV stays under `high_water` "
        "(at an acceptable preemption risk, advanced.max_preemption_risk) and, with "
        "slo.admission, within the TPOT SLO; when no backend can, the request waits in the "
        "gateway queue or is refused. false turns all of it off.")
    high_water: float = Field(
        default=0.9, gt=0, le=1,
        description="The fraction of a backend's KV blocks a request's peak may fill.")
    reservation_quantile: float = Field(
        default=0.9, gt=0, lt=1,
        description="A request's KV reservation holds its reply's length at this quantile of "
        "the model's learned reply lengths (bounded by its max_tokens; exactly max_tokens with "
        "ignore_eos), re-estimated as a stream outgrows it; a backend's requests are held "
        "together to this quantile of their total (their expected blocks plus z standard "
        "deviations of it, at most the sum of their own): higher queues more in the gateway, "
        "lower lets more backends preempt.")
    context_tokens: int = Field(
        default=8192, ge=1,
        description="A backend's context length (max_model_len): a request without max_tokens "
        "may run to it, less its prompt.")
    offload_long_prompts: bool = Field(
        default=True,
        description="cost policy: a prompt much longer than the recent ones goes to a slower "
        "backend that can give it its first token soon and keep its replies within the TPOT "
        "SLO, sparing the fast backends' decodes the long prefills (parameters in "
        "advanced.offload). false: long prompts go where the scores say, mostly the fastest.")
    queue: QueueSettings = Field(default=QueueSettings(), description="The gateway queue.")
    priority_header: str = Field(
        default="x-kvgate-priority", min_length=1,
        description="Request header carrying the priority class (an integer, higher first).")
    tenant_header: str = Field(
        default="x-kvgate-tenant", min_length=1,
        description="Request header naming the tenant (fair-share key) when API keys are off.")
    session_header: str | None = Field(
        default=None,
        description="Request header carrying the session affinity key; null: the body's "
        "`user` field.")
    tokenizers: dict[str, str] = Field(
        default_factory=dict,
        description="model -> path of its tokenizer.json, for exact prompt counts (needs the "
        "optional `tokenizers` package); other models are estimated from characters.")
    poll_interval_s: float = Field(default=0.1, gt=0,
                                   description="Each backend's /metrics is scraped this often.")
    scrape_timeout_s: float = Field(default=0.5, gt=0,
                                    description="One /metrics scrape, connect to body, at most.")
    max_snapshot_age_s: float = Field(
        default=1.0, gt=0,
        description="A backend's scraped state older than this is stale: never read as idle, "
        "it keeps its last reading less what the gateway sent there since.")
    seed: int | None = Field(
        default=None,
        description="Seeds the policy's random choices (tests, reproducible runs).")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """A key that moved to the `slo` or `advanced` section names its new place."""
        if isinstance(data, dict):
            moved = sorted(key for key in data if key in MOVED_ROUTING_KEYS)
            if moved:
                raise ValueError("; ".join(f"routing.{key} is now {MOVED_ROUTING_KEYS[key]}"
                                           for key in moved))
        return data

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        names = policy_names()
        if value not in names:
            raise ValueError(f"unknown policy {value!r}; known: {', '.join(names)}")
        return value

    @field_validator("tokenizers")
    @classmethod
    def _tokenizer_files(cls, value: dict[str, str]) -> dict[str, str]:
        if value and importlib.util.find_spec("tokenizers") is None:
            raise ValueError("exact tokenizers need the optional 'tokenizers' package "
                             "(pip install tokenizers), which is not installed")
        for model, path in value.items():
            if not Path(path).is_file():
                raise ValueError(f"{model}: {path} is not a readable tokenizer.json file")
        return value


class SloSettings(_Section):
    """The one SLO: a request is served well when its first token comes within `ttft_s` and its
    reply runs at `tpot_s` per token or faster. The goodput scorer and the long-prompt offload
    aim at it; with `admission` (and routing.admission), a backend takes a request only while
    the replies decoding there are predicted to stay within `tpot_s` with it there, and what no
    backend can take is refused with 429 and a Retry-After, so past the fleet's SLO capacity the
    excess is shed instead of every reply slowing down. A backend with none of the gateway's
    requests in flight, or whose speed has not been read yet, is never gated; one too slow for
    the SLO even alone is held to twice its idle TPOT. Requests of priority class
    `exempt_priority` or higher (routing.priority_header) are never refused for it."""

    ttft_s: float = Field(default=1.0, gt=0, description="Time to first token, the target.")
    tpot_s: float = Field(default=0.05, gt=0, description="Time per output token, the target.")
    admission: bool = Field(
        default=True,
        description="Refuse (429 `over_slo`, with Retry-After) what would push the replies on "
        "every backend past `tpot_s`; false: admit up to the KV limits only.")
    exempt_priority: int | None = Field(
        default=None,
        description="Requests of this priority class or higher are never refused for the SLO; "
        "null: none is exempt.")

class OffloadSettings(_Section):
    """The long-prompt offload of the cost policy (routing.offload_long_prompts): which prompts
    are long and which backends may take them."""

    ratio: float = Field(
        default=2.0, gt=0,
        description="A prompt is long when its prefill is at least this many times the recent "
        "median.")
    slower_factor: float = Field(
        default=1.5, gt=0,
        description="A backend is slower when its bare decode step is this many times the "
        "fastest's.")
    ttft_budget_s: float = Field(
        default=0.3, gt=0,
        description="The first token a slower backend must promise to get a long prompt.")
    window: int = Field(default=512, ge=1,
                        description="Recent prompts the median is taken over.")
    min_seen: int = Field(default=64, ge=1,
                          description="Prompts seen before any is called long.")


class ProbeSettings(_Section):
    """Speed probes of the cost policy: a backend whose learned speed rests on too few replies
    gets the next request that can show its speed, while it is idle and would serve it soon, so
    a backend read as too slow at a cold start is measured again."""

    replies_needed: int = Field(default=8, ge=1,
                                description="Replies a backend's speed must rest on.")
    ttft_budget_s: float = Field(default=0.3, gt=0,
                                 description="A probe's predicted first token, at most.")
    max_probes: int = Field(default=16, ge=1, description="Probes per backend, at most.")


class AdvancedSettings(_Section):
    """Knobs whose right value depends on the fleet and the traffic; change them with the
    simulator's figures at hand (`kvgate simulate`). Each description says what it trades."""

    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Scorer weights of the chosen policy, by scorer name; unnamed ones keep "
        "their defaults. For cost: `{ttft: 2, goodput: 2, prefill_load: 4.5, preemption: 1, "
        "prefix: 0.3, session: 0.3}`. They trade the request's own latency (ttft) against the "
        "others' (goodput, prefill_load) and against cache reuse (prefix, session). A name the "
        "policy has no scorer for is an error.")
    max_preemption_risk: float = Field(
        default=0.1, ge=0, le=1,
        description="A backend takes a request only at a predicted preemption risk at most "
        "this high: lower queues more in the gateway, higher lets more backends preempt.")
    slo_wait_s: float = Field(
        default=0.0, ge=0,
        description="How long a request may wait for a backend within the TPOT SLO before its "
        "429: longer serves a few more of them, but a waiting queue head holds up every "
        "arrival behind it.")
    poll_group_size: int = Field(
        default=32, ge=1,
        description="Backends scraped in the same instant: larger groups cost less CPU, but "
        "each group's answers are parsed in one burst that delays the gateway's other work.")
    full_scrape_interval_s: float = Field(
        default=1.0, gt=0,
        description="vLLM backends are asked for every series they expose about this often, "
        "and for the load gauges alone in between: rarer costs less CPU, but the counters, the "
        "KV capacity and the LoRA adapters in a snapshot are older. At or below "
        "routing.poll_interval_s: every series at every scrape.")
    offload: OffloadSettings = Field(default=OffloadSettings(),
                                     description="The long-prompt offload's rule.")
    probe: ProbeSettings = Field(default=ProbeSettings(), description="The speed probes' rule.")
    goodput_ttft_spread: float = Field(
        default=0.5, gt=0,
        description="How far actual TTFTs scatter around the predictions (sigma of "
        "log(actual / predicted)): wider makes the goodput scorer less sure of a backend near "
        "the SLO.")
    goodput_tpot_spread: float = Field(
        default=0.35, gt=0, description="The same for TPOTs.")

    @field_validator("weights")
    @classmethod
    def _non_negative(cls, value: dict[str, float]) -> dict[str, float]:
        for name, weight in value.items():
            if weight < 0:
                raise ValueError(f"weight {name!r} must be >= 0")
        return value


def policy_context(routing: RoutingSettings, slo: SloSettings, advanced: AdvancedSettings,
                   rng: random.Random | None = None) -> PolicyContext:
    """What the policy's plugins are built from (ValueError naming a weight the policy lacks,
    when the Router is built)."""
    o, p = advanced.offload, advanced.probe
    return PolicyContext(
        rng=rng or random.Random(routing.seed), weights=dict(advanced.weights),
        slo=SloTargets(slo.ttft_s, slo.tpot_s), offload_long_prompts=routing.offload_long_prompts,
        offload=OffloadParams(ratio=o.ratio, slower_factor=o.slower_factor,
                              ttft_budget_s=o.ttft_budget_s, window=o.window,
                              min_seen=o.min_seen),
        probe=ProbeParams(replies_needed=p.replies_needed, ttft_budget_s=p.ttft_budget_s,
                          max_probes=p.max_probes),
        goodput=GoodputParams(advanced.goodput_ttft_spread, advanced.goodput_tpot_spread))


def dispatch_config(routing: RoutingSettings, slo: SloSettings, advanced: AdvancedSettings
                    ) -> DispatchConfig:
    return DispatchConfig(
        admission=routing.admission, high_water=routing.high_water,
        max_preemption_risk=advanced.max_preemption_risk,
        queue_max_depth=routing.queue.max_depth, queue_timeout_s=routing.queue.timeout_s,
        queue_max_per_tenant=routing.queue.max_per_tenant,
        slo=SloTargets(slo.ttft_s, slo.tpot_s), slo_admission=slo.admission,
        slo_wait_s=advanced.slo_wait_s, slo_exempt_priority=slo.exempt_priority)
