"""What the Dispatcher (routing/dispatch.py) takes and gives back, as values: the `Job` it
decides for, the `Completion` it learns from, and its answers — `Dispatch` (placed, holding a
ledger lease), `Waiting` (queued), `Rejection` (answered without dispatch) and `Pumped` (what one
pump did) — plus the small fixed set of decision reasons that `decision_counts` is keyed by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from routing.cost import RequestCost
from routing.kv_hold import Hold
from routing.ledger import Lease
from routing.policy import Decision
from routing.prefix import PrefixChain
from routing.ttft import Prediction

DEFAULT_TENANT = "anonymous"
NO_BACKEND = "-"  # the backend label of a decision that chose none

# Decision reasons, the third key of `decision_counts` (a small, fixed set).
ADMITTED = "admitted"  # dispatched at once, admissible
QUEUED = "queued"  # dispatched after waiting in the gateway queue
OVERSIZED = "oversized"  # larger than every high-water mark: sent anyway
UNCHECKED = "unchecked"  # admission off: the policy alone decided
RETRY = "retry"  # a second attempt after a failure before the first byte
QUEUE_FULL = "queue_full"
TENANT_QUEUE_FULL = "tenant_queue_full"
QUEUE_TIMEOUT = "queue_timeout"
OVER_SLO = "over_slo"  # every backend that could take it is at its TPOT SLO (SLO admission)
NO_HEALTHY_BACKEND = "no_backend"
CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Job:
    """One request as the Dispatcher sees it. `prompt` is the text the model reads, one canonical
    string (for chat, `routing.prefix.conversation_text` of the messages)."""

    request_id: str
    model: str
    prompt: str = field(repr=False)
    max_tokens: int | None = None  # max_completion_tokens or max_tokens: the reply's hard cap
    prompt_tokens: int | None = None  # exact, when the client sent token ids
    min_tokens: int = 0  # vLLM's min_tokens: the reply's floor
    ignore_eos: bool = False  # vLLM's ignore_eos: the reply runs to its cap
    priority: int = 0  # higher leaves the queue first
    tenant: str = DEFAULT_TENANT
    session: str | None = None
    cache_salt: str | None = None
    stream: bool = False


WHOLE_ANSWER_MIN_TOKENS = 16  # a non-streamed answer this long teaches its backend's speed


@dataclass(frozen=True, slots=True)
class Completion:
    """What the gateway learned from a finished request; any figure may be missing."""

    prompt_tokens: int | None = None  # usage.prompt_tokens
    completion_tokens: int | None = None  # usage.completion_tokens
    ttft_s: float | None = None  # dispatch to first token (the gateway queue excluded)
    tpot_s: float | None = None  # (end - first token) / (output tokens - 1)
    duration_s: float | None = None  # dispatch to the end of the answer
    finish_reason: str | None = None  # "length": the reply was cut (the cost model's censoring)

    def decode_tpot(self, predicted_ttft_s: float) -> float | None:
        """The time per output token: as measured on a stream, else, for an answer that came
        whole (no first token seen) of `WHOLE_ANSWER_MIN_TOKENS` tokens or more, its time from
        dispatch less the first token's predicted time, over the tokens after the first: its
        decode outweighs the error in that prediction. Without it a fleet serving only whole
        answers would never learn its backends' speeds."""
        if self.tpot_s is not None or self.ttft_s is not None:
            return self.tpot_s
        tokens, duration = self.completion_tokens, self.duration_s
        if tokens is None or duration is None or tokens < WHOLE_ANSWER_MIN_TOKENS:
            return None
        tpot = (duration - predicted_ttft_s) / (tokens - 1)
        return tpot if tpot > 0.0 else None


class Waiting:
    """A queued request: the handle `pump`, `cancel` and `Rejection.waiting` refer to. Hashable by
    identity, so the caller can key its future on it."""

    __slots__ = ("job", "cost", "chain", "enqueued_at")

    def __init__(self, job: Job, cost: RequestCost, chain: PrefixChain, enqueued_at: float) -> None:
        self.job = job
        self.cost = cost
        self.chain = chain
        self.enqueued_at = enqueued_at

    def __repr__(self) -> str:
        return f"Waiting({self.job.request_id!r}, since={self.enqueued_at:.3f})"


class Dispatch:
    """One attempt on one backend, holding its ledger lease until `Dispatcher.finish`."""

    __slots__ = ("job", "cost", "chain", "decision", "prediction", "lease", "dispatched_at",
                 "queue_wait_s", "attempt", "tried", "waiting", "reason", "block_size",
                 "commit", "context_tokens", "finished")

    def __init__(self, *, job: Job, cost: RequestCost, chain: PrefixChain, decision: Decision,
                 prediction: Prediction | None, lease: Lease, dispatched_at: float,
                 queue_wait_s: float, attempt: int, tried: tuple[str, ...],
                 waiting: Waiting | None, reason: str, block_size: int,
                 commit: Hold, context_tokens: float = 0.0) -> None:
        self.job = job
        self.cost = cost
        self.chain = chain
        self.decision = decision
        self.prediction = prediction
        self.lease = lease
        self.dispatched_at = dispatched_at
        self.queue_wait_s = queue_wait_s  # 0 when dispatched at once
        self.attempt = attempt  # 1 for the first try
        self.tried = tried  # backends tried so far, this one last
        self.waiting = waiting  # the queue entry it left, if it waited
        self.reason = reason  # ADMITTED, QUEUED, OVERSIZED, UNCHECKED or RETRY
        self.block_size = block_size  # the backend's KV block, in tokens
        self.commit = commit  # its share of the backend's committed peak (routing/kv_hold.py)
        # Its context as the backend's decode steps read it on average (prompt plus half the
        # expected reply): its share of the gateway's record of that backend's work.
        self.context_tokens = context_tokens
        self.finished = False

    @property
    def backend_id(self) -> str:
        return self.decision.backend_id

    def route_header(self) -> str:
        """The x-kvgate-route value: policy, predicted TTFT and its breakdown, and why."""
        parts = [f"policy={self.decision.policy}"]
        p = self.prediction
        if p is not None:
            parts += [
                f"ttft_ms={_ms(p.predicted_ttft_s)}",
                f"queued_prefill_ms={_ms(p.queued_prefill_s)}",
                f"prefill_ms={_ms(p.own_prefill_s)}",
                f"kv_wait_ms={_ms(p.kv_wait_s)}",
                f"step_ms={_ms(p.step_s)}",
                f"preemption_risk={p.preemption_risk:.3f}",
            ]
        parts.append(f"admission={self.reason}")
        why = self.decision.reason if p is None else f"{self.decision.reason} ({p.reason})"
        parts.append(f"reason={why}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request answered without dispatch: `status` (429 queue full or over the TPOT SLO, 503
    timed out or no backend) with `retry_after_s` seconds for the Retry-After header."""

    job: Job
    status: int
    code: str  # QUEUE_FULL, TENANT_QUEUE_FULL, OVER_SLO, QUEUE_TIMEOUT or NO_HEALTHY_BACKEND
    message: str
    retry_after_s: int | None
    queue_wait_s: float = 0.0
    waiting: Waiting | None = None


@dataclass(frozen=True, slots=True)
class Pumped:
    """What one `pump` did: queued requests now dispatched, and those answered without dispatch
    (timed out, or no backend left to route to)."""

    dispatched: tuple[Dispatch, ...] = ()
    rejected: tuple[Rejection, ...] = ()


def _ms(seconds: float) -> str:
    return "inf" if not math.isfinite(seconds) else f"{seconds * 1000.0:.1f}"
