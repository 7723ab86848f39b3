"""Predicted time to first token, and preemption risk, for one request on one candidate backend.

The model, per backend:
    ttft = queued prefill + own uncached prefill + wait for KV blocks + one scheduler step
- queued prefill: the prompts waiting ahead (the snapshot's waiting queue plus what the gateway
  dispatched since that scrape), each the model's typical prompt, discounted by the backend's prefix
  cache hit rate, at the backend's prefill speed;
- own prefill: this prompt minus the tokens likely cached there, at the same speed;
- KV wait: when the prompt's blocks do not fit in what is free after the queue ahead, the time for
  the running sequences to release the shortfall (they release everything they hold once per mean
  reply length in decode steps);
- one step: fixed overhead plus a decode step at the running batch size (the first token comes out
  of a step shared with every running sequence).
The predicted TPOT is the decode step once the request runs alongside everything already there,
stretched by the prefills interleaved with the decodes:
    tpot = decode step(running + queued ahead + this one) / (1 - prefill busy)
where prefill busy is the fraction of the backend's time its recent prefill load (uncached prompt
tokens per second the gateway sent it, `PrefillRate`, this prompt included) takes at its prefill
speed, capped at `MAX_PREFILL_BUSY`. `ProfileEstimator` learns the bare decode step from observed
TPOTs with that stretch taken out (`Prediction.prefill_busy`), against this same batch, so the
context each sequence reads is in its slope.
Preemption risk is P(growth > room) under a normal approximation: growth is what every sequence
already there adds while this request runs (`RequestCost.inflight_growth_*`, releases ignored, so
it errs high) plus this request's own reply; room is capacity minus what is used, queued and this
prompt.

Stale or missing snapshots are never read as idle: only the gateway's ledger is trusted. The
backend is taken to be at least as full as the gateway's reservations (or as its last reading plus
what was dispatched since, if higher), and every in-flight request is counted as queued ahead, so
the predicted TTFT ranks such backends by in-flight count. With no known KV capacity, `fits` is
True and the risk is `UNKNOWN_RISK`: the backend is ranked by load alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routing.cost import RequestCost
from routing.state import Candidate

DEFAULT_HIGH_WATER = 0.9  # fraction of KV blocks a request's peak may fill up to
DEFAULT_BLOCK_SIZE = 16  # vLLM's default, when a backend reports capacity but no block size
UNKNOWN_RISK = 0.5  # preemption risk of a backend whose KV capacity is unknown
MAX_PREFILL_BUSY = 0.9  # prefill share of a backend's time beyond which TPOT is taken as 10x
_SQRT2 = math.sqrt(2.0)


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """How fast a backend works. Defaults fit an 8B model on one current data-centre GPU."""

    prefill_tokens_per_s: float = 10_000.0
    overhead_s: float = 0.005  # per request: scheduling, detokenising, the first network hop
    decode_base_s: float = 0.012  # one decode step at batch size 0 (weights read once)
    decode_per_seq_s: float = 0.0002  # and per running sequence

    def decode_step_s(self, batch: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * batch


@dataclass(frozen=True, slots=True)
class Prediction:
    """One candidate's predicted TTFT and its breakdown (seconds), for scoring and for display."""

    queued_prefill_s: float
    own_prefill_s: float
    kv_wait_s: float  # math.inf when the prompt can never fit
    step_s: float
    predicted_ttft_s: float
    preemption_risk: float  # 0..1
    fits: bool  # the request's peak blocks fit under the high-water mark on top of current use
    oversized: bool  # its peak exceeds the high-water mark even of an empty backend
    free_blocks: int | None  # free for this request after the queue ahead; < 0: over-committed
    prefill_tokens: int  # queued + own uncached: what `ProfileEstimator.observe_ttft` needs
    batch: int  # running sequences assumed
    reason: str
    tpot_batch: int = 1  # sequences decoding together once this one runs
    predicted_tpot_s: float = 0.0  # the decode step at `tpot_batch`, stretched by prefills
    prefill_busy: float = 0.0  # fraction of the backend's time others' prefills take
    tpot_before_s: float = 0.0  # the TPOT of the sequences already there, without this request


def predict(
    candidate: Candidate,
    cost: RequestCost,
    cached_tokens: int,
    profile: BackendProfile,
    *,
    high_water: float = DEFAULT_HIGH_WATER,
    prefill_tokens_per_s: float = 0.0,
    own_prefill_tokens_per_s: float = 0.0,
) -> Prediction:
    """Ledger figures (`reserved_blocks`, `blocks_since_scrape`) are in the backend's own blocks;
    `prefill_tokens_per_s`: the backend's recent prefill load (`PrefillRate.rate`);
    `own_prefill_tokens_per_s`: what this request's uncached prompt adds to it."""
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

    typical = cost.typical_prompt_tokens
    if snap is not None and not candidate.stale:
        source = "fresh"
        running = snap.running if snap.running is not None else candidate.inflight
        waiting = snap.waiting
        if waiting is None:  # not exposed: the gateway's own requests beyond the running ones
            waiting = max(0, candidate.inflight - candidate.dispatched_since_scrape - running)
        queued_seqs = waiting + candidate.dispatched_since_scrape
        if last_used is not None:
            used = last_used + candidate.blocks_since_scrape
        else:
            used = candidate.reserved_blocks
        # Waiting prompts take their blocks before this one; their growth is counted in the risk.
        pending = waiting * math.ceil(typical / block_size)
        queued_tokens = queued_seqs * typical * (1.0 - (snap.prefix_cache_hit_rate or 0.0))
        growing = running + waiting
        tpot_batch = running + queued_seqs + 1
    else:
        source = "stale snapshot, ledger only" if snap is not None else "no snapshot, ledger only"
        running = candidate.inflight
        # As fleet.effective_free_blocks: the last reading plus what was dispatched since, or
        # the ledger's reservations, whichever is fuller.
        since = candidate.blocks_since_scrape if last_used is not None else 0
        used = max(candidate.reserved_blocks, (last_used or 0) + since)
        pending = 0
        queued_tokens = candidate.inflight * typical
        growing = candidate.inflight
        tpot_batch = candidate.inflight + 1

    tps = profile.prefill_tokens_per_s
    own_tokens = max(0, cost.prompt_tokens - cached_tokens)
    queued_s = queued_tokens / tps
    own_s = own_tokens / tps
    decode_s = profile.decode_step_s(running)
    step_s = profile.overhead_s + decode_s
    prefill_tokens = int(queued_tokens) + own_tokens
    busy_before = min(MAX_PREFILL_BUSY, max(0.0, prefill_tokens_per_s / tps))
    busy = min(MAX_PREFILL_BUSY, max(0.0, (prefill_tokens_per_s + own_prefill_tokens_per_s) / tps))
    tpot_s = profile.decode_step_s(tpot_batch) / (1.0 - busy)
    before_s = profile.decode_step_s(tpot_batch - 1) / (1.0 - busy_before)

    if capacity is None:
        ttft = queued_s + own_s + step_s
        return Prediction(queued_s, own_s, 0.0, step_s, ttft, UNKNOWN_RISK, True, False, None,
                          prefill_tokens, running, f"{source}: KV capacity unknown",
                          tpot_batch, tpot_s, busy_before, before_s)

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
                      busy_before, before_s)


class PrefillRate:
    """Uncached prompt tokens per second sent to one backend, exponentially averaged over
    `tau_s`. `now` must not go backwards (an earlier value counts as the latest seen)."""

    __slots__ = ("_tau", "_sum", "_at")

    def __init__(self, tau_s: float = 5.0) -> None:
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


class _DecayedLine:
    """Weighted least squares y = a + b x over observations whose weights halve every half-life;
    seeded with pseudo-points on a prior line so it is defined before any data arrives."""

    __slots__ = ("_decay", "_w", "_x", "_y", "_xx", "_xy")

    def __init__(self, a: float, b: float, x_ref: float, weight: float, half_life: float) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        for x in (0.0, x_ref):
            self._add(x, a + b * x, weight / 2.0)

    def _add(self, x: float, y: float, w: float) -> None:
        self._w += w
        self._x += w * x
        self._y += w * y
        self._xx += w * x * x
        self._xy += w * x * y

    def observe(self, x: float, y: float) -> None:
        d = self._decay
        self._w *= d
        self._x *= d
        self._y *= d
        self._xx *= d
        self._xy *= d
        self._add(x, y, 1.0)

    def fit(self, min_slope: float, max_slope: float) -> tuple[float, float]:
        """(intercept >= 0, slope within bounds): noise must never make work look free."""
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        slope = (self._xy / self._w - mx * my) / var if var > 1e-12 else min_slope
        slope = min(max_slope, max(min_slope, slope))
        return max(0.0, my - slope * mx), slope


class ProfileEstimator:
    """Learns one backend's profile online from what the gateway measures on its requests.

    TPOT samples fit the decode step against batch size; TTFT samples (dispatch to first token,
    gateway queue excluded) minus the decode step fit overhead + prefill tokens / speed. Both start
    from the prior profile, worth `prior_weight` observations, and forget with `half_life`.
    """

    def __init__(
        self,
        prior: BackendProfile | None = None,
        *,
        half_life: float = 200.0,
        prior_weight: float = 4.0,
    ) -> None:
        p = prior or BackendProfile()
        self._prefill = _DecayedLine(p.overhead_s, 1.0 / p.prefill_tokens_per_s, 4096.0,
                                     prior_weight, half_life)
        self._decode = _DecayedLine(p.decode_base_s, p.decode_per_seq_s, 64.0, prior_weight,
                                    half_life)
        self._profile: BackendProfile | None = p

    def observe_ttft(self, prefill_tokens: int, batch: int, seconds: float) -> None:
        """One request's dispatch-to-first-token time; `prefill_tokens` and `batch` as predicted
        at dispatch (`Prediction.prefill_tokens`, `Prediction.batch`)."""
        base, per_seq = self._decode.fit(0.0, 1.0)
        self._prefill.observe(float(prefill_tokens), seconds - (base + per_seq * batch))
        self._profile = None

    def observe_tpot(self, batch: int, seconds: float) -> None:
        """One request's time per output token at (about) `batch` sequences decoding together
        (`Prediction.tpot_batch` at dispatch)."""
        self._decode.observe(float(batch), seconds)
        self._profile = None

    def profile(self) -> BackendProfile:
        if self._profile is None:
            overhead, per_token = self._prefill.fit(1e-7, 1e-2)  # 100 to 10M tokens/s
            base, per_seq = self._decode.fit(0.0, 1.0)
            self._profile = BackendProfile(1.0 / per_token, overhead, base, per_seq)
        return self._profile
