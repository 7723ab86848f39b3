"""The TTFT model (routing/ttft.py's docstring) for one request on one backend, in two parts.

- `backend_load` reads what does not depend on the request: the backend's capacity, its queue
  ahead, its batch and decode step, its prefill load. It depends on the candidate (a frozen
  view), the backend's profile, the gateway's `BackendWork` record, the time and the model's
  typical prompt and reply, so a router computes it once per backend per state change and
  reuses it for every request decided at that state (routing/scheduling/backends.py).
- `predict_on` adds one request to a `BackendLoad`: its own prefill, its KV fit and wait, its
  TPOT and what it does to the replies already there, its preemption risk.
`predict` is the two together. Pure, apart from `BackendWork`'s memo of the last scrape it read
and its decay to `now` (both idempotent at one instant).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from routing.backend_work import BackendWork
from routing.cost import RequestCost
from routing.state import Candidate
from routing.ttft import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_HIGH_WATER,
    MAX_PREFILL_BUSY,
    UNKNOWN_RISK,
    BackendProfile,
    Prediction,
)

_SQRT2 = math.sqrt(2.0)
_FRESH = "fresh"
_STALE = "stale snapshot, ledger only"
_MISSING = "no snapshot, ledger only"
# The prediction's reason by (source, verdict), formatted once.
_REASONS = {
    (source, verdict): f"{source}: {verdict}"
    for source in (_FRESH, _STALE, _MISSING)
    for verdict in ("KV capacity unknown", "larger than the high-water mark",
                    "over the high-water mark", "waits for KV blocks", "fits")
}


class BackendLoad(NamedTuple):
    """A backend's side of the TTFT model at one instant (seconds, tokens, blocks)."""

    source: str  # fresh, stale snapshot or no snapshot
    capacity: int | None  # KV blocks (a TGI token budget); None if unknown
    block_size: int
    used: int  # KV blocks in use, the gateway's dispatches since the scrape included
    pending: int  # blocks the waiting prompts take before a new one
    running: int
    growing: int  # sequences whose growth counts towards the preemption risk
    tpot_batch: int  # sequences decoding together once one more runs
    queued_tokens: float  # uncached prompt tokens ahead
    queued_s: float
    decode_s: float  # one decode step of the running batch
    step_s: float
    tokens_per_s: float  # prefill speed
    rate_sum: float  # the recent prefill load's decayed sum (`PrefillRate`), 0 without a record
    rate_tau: float
    load: float  # the recent prefill load, uncached tokens per second
    busy: float  # share of the backend's time prefills take
    kv_before: float  # KV tokens a decode step reads before one more request
    before_s: float  # the TPOT of the sequences there, without one more request
    decode_base_s: float
    decode_per_kv_token_s: float
    # The block size the gateway's ledger counts this backend's leases in: the snapshot's,
    # else 1 for a token budget without KV figures, else vLLM's default.
    lease_block_size: int


def backend_load(candidate: Candidate, profile: BackendProfile, work: BackendWork | None,
                 now: float, typical: float, mean_output_all: float) -> BackendLoad:
    """`typical`, `mean_output_all`: the model's typical prompt and unbounded mean reply
    (`RequestCost.typical_prompt_tokens`, `.mean_output_all`)."""
    snap = candidate.snapshot
    spec = candidate.spec
    capacity: int | None = None
    block_size = DEFAULT_BLOCK_SIZE
    if snap is not None and snap.block_size:
        block_size = snap.block_size
    if snap is not None and snap.kv_total_blocks:
        capacity = snap.kv_total_blocks
    elif spec.max_batch_total_tokens:  # TGI: a token budget from its launcher setting
        capacity, block_size = spec.max_batch_total_tokens, 1
    last_used: int | None = None
    if snap is not None and capacity is not None:
        if snap.kv_free_blocks is not None:
            last_used = capacity - snap.kv_free_blocks
        elif snap.kv_usage is not None:
            last_used = round(snap.kv_usage * capacity)

    tps = profile.prefill_tokens_per_s
    per_seq = work.context_per_request() if work is not None else None
    if per_seq is None:
        per_seq = typical + 0.5 * mean_output_all
    mean_prompt = work.mean_uncached() if work is not None else None
    queued_tokens: float
    if snap is not None and not candidate.stale:
        source = _FRESH
        running = snap.running if snap.running is not None else candidate.inflight
        waiting = snap.waiting
        if waiting is None:  # not exposed: the gateway's own requests beyond the running ones
            waiting = max(0, candidate.inflight - candidate.dispatched_since_scrape - running)
        if work is not None:
            since, queued_tokens = work.queued_tokens(snap.taken_at, waiting, now, tps)
        else:
            since = candidate.dispatched_since_scrape
            queued_tokens = (waiting + since) * typical * (1.0 - (snap.prefix_cache_hit_rate
                                                                  or 0.0))
        queued_seqs = waiting + since
        if last_used is not None:
            used = last_used + candidate.blocks_since_scrape
        else:
            used = candidate.reserved_blocks
        # Waiting prompts take their blocks before this one; their growth is counted in the risk.
        pending = waiting * math.ceil(typical / block_size)
        growing = running + waiting
        tpot_batch = running + queued_seqs + 1
    else:
        source = _STALE if snap is not None else _MISSING
        running = candidate.inflight
        # As fleet.effective_free_blocks: the last reading plus what was dispatched since, or
        # the ledger's reservations, whichever is fuller.
        since_blocks = candidate.blocks_since_scrape if last_used is not None else 0
        used = max(candidate.reserved_blocks, (last_used or 0) + since_blocks)
        pending = 0
        queued_tokens = candidate.inflight * (mean_prompt if mean_prompt is not None else typical)
        if work is not None:
            queued_tokens = max(queued_tokens, work.backlog(now, tps))
        growing = candidate.inflight
        tpot_batch = candidate.inflight + 1

    decode_s = profile.decode_step_s(running * per_seq)
    if work is not None:
        rate = work.rate
        load = rate.rate(now)
        rate_sum, rate_tau = rate.total(now), rate.tau_s
    else:  # no record: no load, and no share for this request's own prefill either
        load = rate_sum = 0.0
        rate_tau = math.inf
    busy = min(MAX_PREFILL_BUSY, max(0.0, load / tps))
    kv_before = (tpot_batch - 1) * per_seq
    return BackendLoad(
        source, capacity, block_size, used, pending, running, growing, tpot_batch,
        queued_tokens, queued_tokens / tps, decode_s, profile.overhead_s + decode_s, tps,
        rate_sum, rate_tau, load, busy, kv_before,
        profile.decode_step_s(kv_before) / (1.0 - busy), profile.decode_base_s,
        profile.decode_per_kv_token_s, lease_block_size(candidate))


def lease_block_size(candidate: Candidate) -> int:
    """The backend's KV block size in tokens as leases count it (1 for a token budget)."""
    snap = candidate.snapshot
    if snap is not None and snap.block_size:
        return snap.block_size
    if (snap is None or not snap.kv_total_blocks) and candidate.spec.max_batch_total_tokens:
        return 1
    return DEFAULT_BLOCK_SIZE


class RequestTerms(NamedTuple):
    """A request's side of the TTFT model, read once per decision from its `RequestCost`."""

    prompt_tokens: int
    peak_tokens: int  # its reservation: prompt plus its reply at the reservation quantile
    half_output: float  # half its expected reply: its mean context beyond the prompt
    mean_all: float  # the model's mean reply: how long a running sequence lives
    output_mean: float
    output_var: float
    growth_mean: float
    growth_var: float


def request_terms(cost: RequestCost) -> RequestTerms:
    return RequestTerms(cost.prompt_tokens, cost.reserve_tokens, 0.5 * cost.output_mean,
                        cost.mean_output_all, cost.output_mean, cost.output_var,
                        cost.inflight_growth_mean, cost.inflight_growth_var)


_new = tuple.__new__  # builds a Prediction without its Python-level __new__


def predict_on(b: BackendLoad, t: RequestTerms, cached_tokens: int,
               high_water: float = DEFAULT_HIGH_WATER) -> Prediction:
    """One request (`t`) on a backend whose load is `b`; `cached_tokens`: its prompt's tokens
    the backend likely holds already."""
    (source, capacity, block_size, used, pending, running, growing, tpot_batch, queued_tokens,
     queued_s, decode_s, step_s, tps, rate_sum, rate_tau, load, busy, kv_before, before_s,
     decode_base_s, decode_per_kv, _) = b  # one unpacking: cheaper than an attribute read each
    (prompt_tokens, peak_tokens, half_output, mean_all, output_mean, output_var, growth_mean,
     growth_var) = t
    own_tokens = prompt_tokens - cached_tokens if prompt_tokens > cached_tokens else 0
    own_s = own_tokens / tps
    busy_after = (rate_sum + own_tokens) / rate_tau / tps
    if busy_after > 1.0:
        busy_after = 1.0
    kv_after = kv_before + prompt_tokens + half_output
    tpot_s = (decode_base_s + decode_per_kv * kv_after) / (1.0 - busy)
    steps = mean_all if mean_all > 1.0 else 1.0
    # The others also wait out this prompt's prefill once, spread over what is left of their
    # replies (a sequence met at a random instant has about a mean reply still to go).
    others_s = tpot_s + own_s / steps
    prefill_tokens = int(queued_tokens) + own_tokens
    if capacity is None:
        return _new(Prediction, (
            queued_s, own_s, 0.0, step_s, queued_s + own_s + step_s, UNKNOWN_RISK, True, False,
            None, prefill_tokens, running, _REASONS[source, "KV capacity unknown"], tpot_batch,
            tpot_s, busy, before_s, kv_after, load, others_s, decode_base_s, busy_after))

    limit = high_water * capacity
    peak = -(-peak_tokens // block_size)
    prompt_blocks = -(-prompt_tokens // block_size)
    room = capacity - used - pending
    oversized = peak > limit
    fits = used + pending + peak <= limit
    shortfall = prompt_blocks - room
    if shortfall <= 0:
        kv_wait = 0.0
    elif used > 0 and prompt_blocks <= capacity:
        kv_wait = shortfall / used * steps * decode_s
    else:
        kv_wait = math.inf

    spare = room - prompt_blocks
    growth = (growing * growth_mean + output_mean) / block_size
    sd = math.sqrt(growing * growth_var + output_var) / block_size
    if sd > 0.0:
        risk = 0.5 * math.erfc((spare - growth) / (sd * _SQRT2))
    else:
        risk = 1.0 if growth > spare else 0.0

    if oversized:
        verdict = "larger than the high-water mark"
    elif not fits:
        verdict = "over the high-water mark"
    elif kv_wait > 0.0:
        verdict = "waits for KV blocks"
    else:
        verdict = "fits"
    return _new(Prediction, (
        queued_s, own_s, kv_wait, step_s, queued_s + own_s + kv_wait + step_s, risk, fits,
        oversized, room, prefill_tokens, running, _REASONS[source, verdict], tpot_batch, tpot_s,
        busy, before_s, kv_after, load, others_s, decode_base_s, busy_after))


def predict(
    candidate: Candidate,
    cost: RequestCost,
    cached_tokens: int,
    profile: BackendProfile,
    *,
    high_water: float = DEFAULT_HIGH_WATER,
    work: BackendWork | None = None,
    now: float = 0.0,
) -> Prediction:
    """Ledger figures (`reserved_blocks`, `blocks_since_scrape`) are in the backend's own blocks;
    `work`: what the gateway sent this backend (None: nothing recorded, the typical-prompt rules
    apply); `now`: the decision's time, on the clock of the snapshot's `taken_at`."""
    load = backend_load(candidate, profile, work, now, cost.typical_prompt_tokens,
                        cost.mean_output_all)
    return predict_on(load, request_terms(cost), cached_tokens, high_water=high_water)
