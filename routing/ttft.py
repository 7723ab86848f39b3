"""Predicted time to first token, time per output token and preemption risk for one request on
one candidate backend, and the online per-backend speed profile they use.

The backend is a vLLM-like engine: continuous batching on a paged KV cache with chunked prefill.
One scheduler step runs every running sequence's next token plus prefill chunks, and takes
    step = base + per KV token x (KV tokens the decodes read) + prefill tokens / prefill speed
- base: scheduling plus reading the weights once (a small batch is memory-bound);
- KV read: each decoding sequence reads its whole context every step, a shared cached prefix
  included, so a batch of long contexts decodes slower than a batch of short ones of equal size;
- prefill: compute-bound, per token.
Hence, per backend:
    ttft = queued prefill + own uncached prefill + wait for KV blocks + one step
    tpot = (base + per KV token x KV read) / (1 - prefill busy)
- queued prefill: the uncached prompt tokens ahead of this one at the prefill speed. The gateway
  knows what it sent (`BackendWork`) and takes the larger of two readings: the scrape's waiting
  queue, counted as the last prompts it sent there before the scrape (the queue is FIFO), plus
  the prompts dispatched since the scrape, worked off at the prefill speed from then on;
  and a fluid backlog of everything it sent, worked off at the prefill speed, which also covers
  prompts a scrape shows as running mid-prefill (chunked prefill). Without that record, the
  waiting queue counts at the model's typical prompt, discounted by the backend's hit rate.
- KV read: the sequences that will decode alongside this one (running, waiting, dispatched since
  the scrape) times the mean context (prompt plus half the expected reply) of the gateway's own
  requests in flight there; this request's own context included after it is admitted.
- prefill busy: the fraction of the backend's time prefills take: the uncached prompt tokens
  per second the gateway sent it recently (`BackendWork.rate`) over the prefill speed, capped at
  `MAX_PREFILL_BUSY`: interleaved prefills stretch every decode.
- the sequences already there see their TPOT go from `tpot_before_s` (without this request) to
  `tpot_others_s`: this request's context joins every step's KV read, and its own prefill stalls
  them once, spread over what is left of their replies (about a mean reply).
- KV wait: when the prompt's blocks do not fit in what is free after the queue ahead, the time for
  the running sequences to release the shortfall (they release everything they hold once per mean
  reply length in decode steps).
`ProfileEstimator` learns each backend's speed, as a scale on a reference profile, from the TPOTs
the gateway measures on its own requests (a TPOT is the mean step over the reply). A backend not
measured yet is taken as `SLOW_START_SCALE` times slower than the reference, so an unknown card
is eased in (as a load balancer's slow start does) rather than flooded at the reference speed.
Its first tokens set its speed (the TTFT against the prediction it was dispatched on) until
`BOOTSTRAP_TPOTS` replies have ended: a first token comes within a step or two, a TPOT only
when the reply ends, seconds later on a slow card, while every backend looks alike. From then
on TTFTs are not used: they include queueing inside the engine, which would read as slow
prefill. A backend learned too slow would get nothing and never be measured again;
routing/probe.py sends an idle one requests until its replies have shown its speed.
Preemption risk is P(growth > room) under a normal approximation: growth is what every sequence
already there adds while this request runs (`RequestCost.inflight_growth_*`, releases ignored, so
it errs high) plus this request's own reply; room is capacity minus what is used, queued and this
prompt.

Stale or missing snapshots are never read as idle: only the gateway's ledger is trusted. The
backend is taken to be at least as full as the gateway's reservations (or as its last reading plus
what was dispatched since, if higher), and every in-flight request is counted as queued ahead, so
the predicted TTFT ranks such backends by in-flight work. With no known KV capacity, `fits` is
True and the risk is `UNKNOWN_RISK`: the backend is ranked by load alone.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from routing.cost import RequestCost
from routing.physics import REFERENCE_PROFILE
from routing.state import Candidate

DEFAULT_HIGH_WATER = 0.9  # fraction of KV blocks a request's peak may fill up to
DEFAULT_BLOCK_SIZE = 16  # vLLM's default, when a backend reports capacity but no block size
UNKNOWN_RISK = 0.5  # preemption risk of a backend whose KV capacity is unknown
SLOW_START_SCALE = 4.0  # a backend not measured yet is taken as this much slower than the prior
BOOTSTRAP_TPOTS = 8  # first tokens calibrate a backend's speed until this many TPOTs come in
MAX_PREFILL_BUSY = 0.9  # prefill share of a backend's time beyond which TPOT is taken as 10x
PREFILL_RATE_TAU_S = 5.0  # time constant of a backend's recent prefill load (`PrefillRate`)
_SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """How fast a backend works. Defaults: the reference deployment's figures
    (`routing.physics.REFERENCE_PROFILE`); each backend's own speed is learned online relative to
    it (`ProfileEstimator`)."""

    prefill_tokens_per_s: float = REFERENCE_PROFILE.prefill_tokens_per_s
    overhead_s: float = REFERENCE_PROFILE.overhead_s  # per request, outside the engine's steps
    decode_base_s: float = REFERENCE_PROFILE.decode_base_s  # a decode step reading no KV
    decode_per_kv_token_s: float = REFERENCE_PROFILE.decode_per_kv_token_s  # per KV token read

    def decode_step_s(self, kv_tokens: float) -> float:
        return self.decode_base_s + self.decode_per_kv_token_s * kv_tokens


class Prediction(NamedTuple):
    """One candidate's predicted TTFT and its breakdown (seconds), for scoring and for display.
    A NamedTuple, not a frozen dataclass: every decision builds one per candidate, and a frozen
    dataclass sets its 21 fields one by one (~6 µs against ~1 µs)."""

    queued_prefill_s: float
    own_prefill_s: float
    kv_wait_s: float  # math.inf when the prompt can never fit
    step_s: float
    predicted_ttft_s: float
    preemption_risk: float  # 0..1
    fits: bool  # the request's peak blocks fit under the high-water mark on top of current use
    oversized: bool  # its peak exceeds the high-water mark even of an empty backend
    free_blocks: int | None  # free for this request after the queue ahead; < 0: over-committed
    prefill_tokens: int  # queued + own uncached
    batch: int  # running sequences assumed
    reason: str
    tpot_batch: int = 1  # sequences decoding together once this one runs
    predicted_tpot_s: float = 0.0  # this reply's: the decode step with it there, prefill-stretched
    prefill_busy: float = 0.0  # fraction of the backend's time others' prefills take
    tpot_before_s: float = 0.0  # the TPOT of the sequences already there, without this request
    kv_read_tokens: float = 0.0  # KV tokens a decode step reads with this request there
    prefill_tokens_per_s: float = 0.0  # the backend's recent prefill load (uncached tokens/s)
    tpot_others_s: float = 0.0  # the TPOT of the sequences already there, with this request
    tpot_idle_s: float = 0.0  # this backend's TPOT alone: one decode step reading no KV
    prefill_busy_after: float = 0.0  # `prefill_busy` with this request's own prefill added


class PrefillRate:
    """Uncached prompt tokens per second sent to one backend, exponentially averaged over
    `tau_s`. `now` must not go backwards (an earlier value counts as the latest seen)."""

    __slots__ = ("_tau", "_sum", "_at")

    def __init__(self, tau_s: float = PREFILL_RATE_TAU_S) -> None:
        if not tau_s > 0.0:
            raise ValueError("tau_s must be > 0")
        self._tau = tau_s
        self._sum = 0.0
        self._at = -math.inf

    def _decay(self, now: float) -> None:
        if now > self._at:
            if self._sum:
                self._sum *= math.exp((self._at - now) / self._tau)
            self._at = now

    def add(self, tokens: int, now: float) -> None:
        self._decay(now)
        self._sum += tokens

    def rate(self, now: float, extra_tokens: int = 0) -> float:
        """The rate at `now`, as if `extra_tokens` were added now too."""
        self._decay(now)
        return (self._sum + extra_tokens) / self._tau


class BackendWork:
    """The gateway's own record of the work it sent one backend: its recent prefill load, a fluid
    model of its prefill backlog, the uncached prompt sizes of its last `memory` dispatches (in
    dispatch order, so the scrape's FIFO waiting queue can be read as the last of them) and the
    context tokens of its requests in flight there. `now` must not go backwards."""

    __slots__ = ("rate", "_recent", "_recent_tokens", "_memory", "_context", "_inflight",
                 "_backlog", "_backlog_at", "_scrape_at", "_scrape_waiting", "_since_n",
                 "_queue", "_queue_at")

    def __init__(self, tau_s: float = PREFILL_RATE_TAU_S, memory: int = 256) -> None:
        if memory < 1:
            raise ValueError("memory must be >= 1")
        self.rate = PrefillRate(tau_s)
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_tokens = 0
        self._memory = memory
        self._context = 0.0
        self._inflight = 0
        self._backlog = 0.0
        self._backlog_at = -math.inf
        # The last scrape read (`queued_tokens`): its time and waiting count, the dispatches
        # since it, and the queue it implies: `_queue` tokens as of `_queue_at`.
        self._scrape_at = math.nan
        self._scrape_waiting = -1
        self._since_n = 0
        self._queue = 0.0
        self._queue_at = math.nan

    def backlog(self, now: float, tokens_per_s: float) -> float:
        """Uncached prompt tokens sent here and not yet prefilled, had the backend prefilled
        without pause at `tokens_per_s` since each arrived (chunked prefill shares every step
        with the decodes, which take a small part of a prefill step's time)."""
        if now > self._backlog_at:
            if self._backlog:
                self._backlog = max(0.0, self._backlog - (now - self._backlog_at) * tokens_per_s)
            self._backlog_at = now
        return self._backlog

    def dispatched(self, now: float, uncached_tokens: int, context_tokens: float,
                   tokens_per_s: float) -> None:
        self.rate.add(uncached_tokens, now)
        self._backlog = self.backlog(now, tokens_per_s) + uncached_tokens
        if len(self._recent) >= self._memory:
            self._recent_tokens -= self._recent.popleft()[1]
        self._recent.append((now, uncached_tokens))
        self._recent_tokens += uncached_tokens
        if now >= self._scrape_at:  # False while no scrape was read (NaN)
            self._since_n += 1
            self._queue = self._drained(now, tokens_per_s) + uncached_tokens
            self._queue_at = now
        self._context += context_tokens
        self._inflight += 1

    def finished(self, context_tokens: float) -> None:
        self._inflight -= 1
        self._context = max(0.0, self._context - context_tokens) if self._inflight else 0.0

    def mean_uncached(self) -> float | None:
        """Mean uncached prompt of the recent dispatches; None before the first."""
        return self._recent_tokens / len(self._recent) if self._recent else None

    def context_per_request(self) -> float | None:
        """Mean context (prompt plus half the expected reply) of the requests in flight."""
        return self._context / self._inflight if self._inflight > 0 else None

    def queued_tokens(self, taken_at: float, waiting: int, now: float, tokens_per_s: float,
                      max_walk: int = 64) -> tuple[int, float]:
        """(requests dispatched since the scrape at `taken_at`, uncached prompt tokens not yet
        prefilled): the larger of two readings. The fluid backlog (`backlog`: what this gateway
        sent, including prompts a scrape shows as running mid-prefill); and the scrape's
        `waiting` queue, taken as the last prompts sent before it (FIFO; beyond `max_walk` of
        them, at their mean; other gateways' requests count alike), plus every prompt dispatched
        since, each worked off at `tokens_per_s` from when it was sent.

        Dispatches since the scrape drain like the rest: counting them in full until the next
        scrape made every backend look busier the longer ago it was scraped, and as scrapes are
        staggered, requests herded onto whichever backend had just been read.

        The record is walked once per scrape (its figures are then grown by each dispatch), so
        a decision costs O(1) however many came since."""
        if taken_at != self._scrape_at or waiting != self._scrape_waiting:
            self._read_scrape(taken_at, waiting, tokens_per_s, max_walk)
        return self._since_n, max(self._drained(now, tokens_per_s),
                                  self.backlog(now, tokens_per_s))

    def _drained(self, now: float, tokens_per_s: float) -> float:
        """The scrape-anchored queue at `now` (never earlier than its last update)."""
        return max(0.0, self._queue - max(0.0, now - self._queue_at) * tokens_per_s)

    def _read_scrape(self, taken_at: float, waiting: int, tokens_per_s: float,
                     max_walk: int) -> None:
        since: list[tuple[float, int]] = []
        ahead, seen = 0.0, 0
        for at, tokens in reversed(self._recent):
            if at >= taken_at:
                since.append((at, tokens))
                continue
            if seen >= waiting or seen >= max_walk:
                break
            ahead += tokens
            seen += 1
        if seen < waiting:
            mean = ahead / seen if seen else (self.mean_uncached() or 0.0)
            ahead += (waiting - seen) * mean
        self._scrape_at, self._scrape_waiting = taken_at, waiting
        self._since_n, self._queue, self._queue_at = len(since), ahead, taken_at
        for at, tokens in reversed(since):
            self._queue = self._drained(at, tokens_per_s) + tokens
            self._queue_at = at


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
    typical = cost.typical_prompt_tokens
    per_seq = work.context_per_request() if work is not None else None
    if per_seq is None:
        per_seq = typical + 0.5 * cost.mean_output_all
    mean_prompt = work.mean_uncached() if work is not None else None
    if snap is not None and not candidate.stale:
        source = "fresh"
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
        source = "stale snapshot, ledger only" if snap is not None else "no snapshot, ledger only"
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

    own_tokens = max(0, cost.prompt_tokens - cached_tokens)
    queued_s = queued_tokens / tps
    own_s = own_tokens / tps
    decode_s = profile.decode_step_s(running * per_seq)
    step_s = profile.overhead_s + decode_s
    prefill_tokens = int(queued_tokens) + own_tokens
    load = work.rate.rate(now) if work is not None else 0.0
    busy = min(MAX_PREFILL_BUSY, max(0.0, load / tps))
    busy_after = min(1.0, (work.rate.rate(now, own_tokens) if work is not None else 0.0) / tps)
    kv_before = (tpot_batch - 1) * per_seq
    kv_after = kv_before + cost.prompt_tokens + 0.5 * cost.output_mean
    tpot_s = profile.decode_step_s(kv_after) / (1.0 - busy)
    before_s = profile.decode_step_s(kv_before) / (1.0 - busy)
    # The others also wait out this prompt's prefill once, spread over what is left of their
    # replies (a sequence met at a random instant has about a mean reply still to go).
    others_s = tpot_s + own_s / max(1.0, cost.mean_output_all)

    if capacity is None:
        ttft = queued_s + own_s + step_s
        return Prediction(queued_s, own_s, 0.0, step_s, ttft, UNKNOWN_RISK, True, False, None,
                          prefill_tokens, running, f"{source}: KV capacity unknown",
                          tpot_batch, tpot_s, busy, before_s, kv_after, load, others_s,
                          profile.decode_base_s, busy_after)

    limit = high_water * capacity
    peak = cost.peak_blocks(block_size)
    prompt_blocks = cost.prompt_blocks(block_size)
    room = capacity - used - pending
    oversized = peak > limit
    fits = used + pending + peak <= limit
    shortfall = prompt_blocks - room
    if shortfall <= 0:
        kv_wait = 0.0
    elif used > 0 and prompt_blocks <= capacity:
        kv_wait = shortfall / used * max(1.0, cost.mean_output_all) * decode_s
    else:
        kv_wait = math.inf

    spare = room - prompt_blocks
    growth = (growing * cost.inflight_growth_mean + cost.output_mean) / block_size
    sd = math.sqrt(growing * cost.inflight_growth_var + cost.output_var) / block_size
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
    ttft = queued_s + own_s + kv_wait + step_s
    return Prediction(queued_s, own_s, kv_wait, step_s, ttft, risk, fits, oversized, room,
                      prefill_tokens, running, f"{source}: {verdict}", tpot_batch, tpot_s,
                      busy, before_s, kv_after, load, others_s, profile.decode_base_s,
                      busy_after)


class ProfileEstimator:
    """Learns one backend's speed online from the TPOTs the gateway measures on its requests.

    The backend is taken to be the prior profile run `scale` times slower (faster below 1): on
    one model, a GPU's memory bandwidth (decode) and compute (prefill) come in proportion within
    a factor of about 1.5 across current cards, while their ratio is what the data cannot
    separate (a TPOT stretched by prefills reads alike as slow decode or slow prefill, and the
    two loads rise together). One scale is identified robustly from few samples. A reply's TPOT
    is its mean step (module docstring), so with the prior's coefficients
        tpot = scale x (base + per_kv_token x kv_read + prefill load x tpot / prefill speed)
    which is linear in `scale`, so each observation gives one reading of it: observed over
    modelled time. `scale` is their geometric mean (the mean of their logs), over observations
    whose weights halve every `half_life`, seeded with `prior_weight` observations at
    `initial_scale`, held within [1/100, 100]. That is the maximum-likelihood scale when times
    scatter log-normally around the model, as the goodput score takes them to. A least-squares
    ratio would weigh each observation by its modelled time squared: the few replies that ran
    under the heaviest prefill load, whose modelled time is the largest and the least exact,
    would set the speed for every other. On the mixed fleet it read the H100s slower and the
    L40Ss faster than their typical replies (loadtest/README.md, session 5).
    """

    def __init__(
        self,
        prior: BackendProfile | None = None,
        *,
        half_life: float = 200.0,
        prior_weight: float = 0.5,
        initial_scale: float = SLOW_START_SCALE,
    ) -> None:
        if not (prior_weight > 0.0 and initial_scale > 0.0 and half_life > 0.0):
            raise ValueError("prior_weight, initial_scale and half_life must be > 0")
        p = prior or BackendProfile()
        self._prior = p
        self._decay = 0.5 ** (1.0 / half_life)
        # Decayed sums of the observations' weights and of their log(observed / modelled).
        self._weight = prior_weight
        self._log_sum = prior_weight * math.log(initial_scale)
        self._profile: BackendProfile | None = None
        self._tpots = 0  # TPOTs observed so far
        self._readings = 0  # first tokens and TPOTs learned from so far

    def observe_ttft(self, prediction: Prediction, seconds: float) -> None:
        """One request's dispatch-to-first-token time, with the prediction it was dispatched on.
        Learned from only until `BOOTSTRAP_TPOTS` TPOTs have come in: a first token arrives
        within a step or two of dispatch, a TPOT only when the reply ends (seconds later on a
        slow card), so first tokens are what calibrate a backend the gateway has just met.
        Later on, TTFTs carry queueing inside the engine (see the module docstring)."""
        if self._tpots >= BOOTSTRAP_TPOTS or not seconds > 0.0:
            return
        p = self._prior
        if prediction.kv_wait_s > 0.0 or not prediction.tpot_idle_s > 0.0:
            return
        # The prediction scales with the profile it was made with; its own scale is its base
        # step over the prior's. Overhead is not scaled.
        at_scale = prediction.tpot_idle_s / p.decode_base_s
        z = (prediction.predicted_ttft_s - p.overhead_s) / at_scale
        y = seconds - p.overhead_s
        if not (z > 0.0 and y > 0.0 and math.isfinite(z)):
            return
        self._observe(y / z)

    def observe_tpot(self, kv_read_tokens: float, prefill_tokens_per_s: float,
                     seconds: float) -> None:
        """One reply's time per output token; `kv_read_tokens` and `prefill_tokens_per_s` as
        predicted at its dispatch (`Prediction.kv_read_tokens`, `.prefill_tokens_per_s`)."""
        if not 0.0 < seconds < math.inf:
            return
        p = self._prior
        z = p.decode_step_s(kv_read_tokens) + prefill_tokens_per_s * seconds / (
            p.prefill_tokens_per_s)
        self._observe(seconds / z)
        self._tpots += 1

    def _observe(self, ratio: float) -> None:
        """One reading of the scale: an observed time over the prior's model of it."""
        self._readings += 1
        d = self._decay
        self._weight = self._weight * d + 1.0
        self._log_sum = self._log_sum * d + math.log(ratio)
        self._profile = None

    @property
    def calibrated(self) -> bool:
        """At least one first token or TPOT has been learned from: the speed is no longer only the
        slow-start guess."""
        return self._readings > 0

    @property
    def replies(self) -> int:
        """Replies whose TPOT has been learned from."""
        return self._tpots

    @property
    def scale(self) -> float:
        return min(100.0, max(0.01, math.exp(self._log_sum / self._weight)))

    def profile(self) -> BackendProfile:
        if self._profile is None:
            p, scale = self._prior, self.scale
            self._profile = BackendProfile(p.prefill_tokens_per_s / scale, p.overhead_s,
                                           p.decode_base_s * scale,
                                           p.decode_per_kv_token_s * scale)
        return self._profile
