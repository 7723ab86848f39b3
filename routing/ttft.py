"""The TTFT model's terms: the reference speed profile (`BackendProfile`), the prediction it gives
one request on one backend (`Prediction`), and the model's constants. `predict`
(routing/predict.py) computes it; `ProfileEstimator` (routing/speed.py) learns each backend's
speed; `BackendWork` (routing/backend_work.py) records what the gateway sent each backend.

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
routing/scheduling/probe.py sends an idle one requests until its replies have shown its speed.
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

from dataclasses import dataclass
from typing import NamedTuple

from routing.physics import REFERENCE_PROFILE

DEFAULT_HIGH_WATER = 0.9  # fraction of KV blocks a request's peak may fill up to
DEFAULT_BLOCK_SIZE = 16  # vLLM's default, when a backend reports capacity but no block size
UNKNOWN_RISK = 0.5  # preemption risk of a backend whose KV capacity is unknown
SLOW_START_SCALE = 4.0  # a backend not measured yet is taken as this much slower than the prior
BOOTSTRAP_TPOTS = 8  # first tokens calibrate a backend's speed until this many TPOTs come in
MAX_PREFILL_BUSY = 0.9  # prefill share of a backend's time beyond which TPOT is taken as 10x
PREFILL_RATE_TAU_S = 5.0  # time constant of a backend's recent prefill load (`PrefillRate`)


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
    dataclass sets its 21 fields one by one, several times slower."""

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
