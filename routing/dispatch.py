"""The per-request decision sequence, and the gateway queue's lifecycle, as one pure object.

`Dispatcher` is what both the live gateway (from asyncio) and the offline fleet simulation (from a
discrete-event loop) call. It never reads a clock, never awaits and draws randomness only from the
router's injected Random: every method takes `now` (monotonic seconds, the Fleet's clock).

The sequence for one request (`submit`):
  cost estimate (routing/cost.py) → prefix chain (routing/prefix.py) → candidates from the Fleet
  → a TTFT prediction per candidate (routing/ttft.py) → admission (routing/admission.py: admit
  now | queue | reject 429) → the router's decision among the admissible candidates → a ledger
  lease of the request's `reserve_blocks` on the chosen backend.
Queued requests (`Waiting`) leave the queue through `pump` (dispatched as soon as the head of
their model's queue is admissible somewhere; expired with a 503 once they waited longer than the
queue timeout) or `cancel` (the client went away). The caller calls `pump` whenever capacity may
have freed (after `finish`, after a scrape) and at `next_deadline(now)`.
`finish` releases the lease exactly once and feeds back what the backend reported: the cost
model's prompt calibration and output-length distribution, and the backend's speed (learned from
the reply's TPOT); `first_token`, called when a streamed reply's first token arrives, calibrates a
backend the gateway has only just met. Each backend's `BackendWork` (routing/ttft.py) records
what this gateway sent it: prompts not yet prefilled, recent prefill load, the context of its
requests in flight.

Rules
- With `admission` on, only admissible backends are offered to the router, whatever the policy:
  the request's prediction fits under the KV high-water mark at an acceptable preemption risk
  (routing/context.py), and the committed peaks of the gateway's own requests in flight there
  (uncached prompt plus expected reply, each) plus this one's stay under the mark too. The second
  rule covers what a scrape cannot show yet: requests accepted but not yet allocated, and the
  growth still ahead of running ones. A request too large for every backend's high-water mark is
  sent anyway (the backend's own limits decide).
  With it off, every policy sees every healthy candidate and nothing queues (pure policies, for
  comparisons).
- SLO admission (`tpot_slo_s` set, with admission on): a backend takes a request only if the
  replies decoding there are predicted to stay within the TPOT SLO with it there (its prefill
  stall and its KV read included: `Prediction.tpot_others_s`). Past that point one more request
  makes every reply there slow, so past the fleet's SLO capacity the gateway sheds the excess
  instead of letting every user miss. A request no backend can take within the SLO is refused with
  429 (`OVER_SLO`) and a Retry-After of when the soonest backend would be back under it if nothing
  else arrived (`slo.recovery_s`: its prefill load decays), at once by default, or after
  waiting in the gateway queue up to `slo_wait_s` for a backend to come back under it (a waiting
  head holds up every arrival behind it, which on the simulated fleet cost more than it saved). A
  backend with none of the gateway's requests in flight is not gated (there is nothing to protect
  there, and the fleet never stops serving); a backend too slow to meet the SLO even alone is held
  to `slo.SLOW_BACKEND_FACTOR` times its own idle TPOT instead. Nor is a backend gated before its
  first speed reading (a first token or a TPOT: `ProfileEstimator.calibrated`): until then its
  speed is the slow-start guess, and a burst at start-up would be refused for a slowness nobody
  has seen. Once read, a backend is still predicted on the slow side until its replies pull the
  scale down: the cold start refuses a few requests (4 of 3,666 in the first 5 s of `python -m
  loadtest.probe --workload mixed --load 0.95 --duration 60 --seeds 0`, 253 in all).
  With `slo_exempt_priority` set, requests of that priority class or higher are never gated:
  past the SLO capacity the lower classes are shed and the higher ones still served.
- Queues are per model, strict priority between classes, fair between tenants, FIFO within one
  (routing/admission.py); the head of a queue is never overtaken, so a large request is not
  starved by smaller ones behind it.
- The prefix index learns a chain at dispatch (the backend will hold it from its first token on),
  and the session table maps a session to its last backend.

The values it takes and returns (Job, Completion, Dispatch, Waiting, Rejection, Pumped, the
decision reasons) live in routing/jobs.py and are re-exported here.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from routing.admission import (
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    AdmissionQueue,
    DrainRate,
    Verdict,
    admit,
    retry_after_s,
    timed_out,
)
from routing.context import DEFAULT_MAX_RISK, RouteContext, build_context, is_admissible
from routing.cost import CostModel, RequestCost
from routing.jobs import (
    ADMITTED,
    CANCELLED,
    DEFAULT_TENANT,
    NO_BACKEND,
    NO_HEALTHY_BACKEND,
    OVER_SLO,
    OVERSIZED,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    QUEUED,
    RETRY,
    TENANT_QUEUE_FULL,
    UNCHECKED,
    Completion,
    Dispatch,
    Job,
    Pumped,
    Rejection,
    Waiting,
)
from routing.ledger import Lease
from routing.policy import NoCandidate, Router, RouteRequest
from routing.prefix import DEFAULT_BLOCK_CHARS, PrefixChain, PrefixIndex, prefix_chain
from routing.scorers import DEFAULT_TPOT_TARGET_S
from routing.slo import recovery_s, tpot_limit
from routing.state import Candidate
from routing.ttft import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_HIGH_WATER,
    BackendProfile,
    BackendWork,
    Prediction,
    ProfileEstimator,
    predict,
)


class FleetLike(Protocol):
    """What the Dispatcher needs from routing.fleet.Fleet."""

    def candidates(self, model: str | None, now: float) -> list[Candidate]: ...
    def lease(self, backend_id: str, blocks: int, now: float) -> Lease: ...


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    admission: bool = True
    high_water: float = DEFAULT_HIGH_WATER  # fraction of a backend's KV blocks a request may fill
    max_preemption_risk: float = DEFAULT_MAX_RISK
    queue_max_depth: int = 1024  # per model
    queue_timeout_s: float = 30.0
    queue_max_per_tenant: int | None = None  # per model
    drain_tau_s: float = 10.0  # time constant of the queue's measured drain rate (Retry-After)
    prefix_block_chars: int = DEFAULT_BLOCK_CHARS
    prefix_index_blocks: int = 8192  # per backend
    sessions: int = 65_536  # sessions remembered (LRU)
    # SLO admission (module docstring): None turns it off.
    tpot_slo_s: float | None = DEFAULT_TPOT_TARGET_S
    # How long a request may wait for a backend within the SLO. 0 (refuse at once) measured
    # best: a waiting head holds up every arrival behind it (loadtest/README.md, session 7).
    slo_wait_s: float = 0.0
    # Requests of this priority class or higher are not SLO-gated; None: every class is.
    slo_exempt_priority: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.high_water <= 1.0:
            raise ValueError("high_water must be in (0, 1]")
        if not 0.0 <= self.max_preemption_risk <= 1.0:
            raise ValueError("max_preemption_risk must be in [0, 1]")
        if self.queue_timeout_s <= 0 or self.queue_max_depth < 0 or self.sessions < 1:
            raise ValueError("queue_timeout_s must be > 0, queue_max_depth >= 0, sessions >= 1")
        if self.tpot_slo_s is not None and not self.tpot_slo_s > 0.0:
            raise ValueError("tpot_slo_s must be > 0 (or None: no SLO admission)")
        if not self.slo_wait_s >= 0.0:
            raise ValueError("slo_wait_s must be >= 0")


class _Survey(NamedTuple):
    """The candidates for one request, their predictions, and the pool the router may use (a
    named tuple: one is made per decision, and a tuple is built faster than a dataclass)."""

    candidates: list[Candidate]
    predictions: dict[str, Prediction]
    matched: dict[str, int]
    commits: dict[str, int]  # committed peak blocks the request would add, by backend
    uncached: dict[str, int]  # prompt tokens the backend would have to prefill, by backend
    pool: list[Candidate]
    reason: str  # ADMITTED, OVERSIZED or UNCHECKED when the pool is usable
    any_fits: bool  # some backend takes it now (KV rule and, with SLO admission, the TPOT SLO)
    all_oversized: bool
    over_slo: bool  # some backend fits its KV, but every one of those is at its TPOT SLO
    slo_retry_s: float | None  # then: the soonest one is back under it (slo.recovery_s)


class Dispatcher:
    """One per gateway process (or per simulated gateway). Not thread-safe."""

    def __init__(
        self,
        fleet: FleetLike,
        router: Router,
        cost_model: CostModel | None = None,
        *,
        config: DispatchConfig | None = None,
        profile: BackendProfile | None = None,
    ) -> None:
        """`profile`: the reference speed; each backend's is learned online relative to it,
        starting slow (ttft.SLOW_START_SCALE) until its replies are measured."""
        self.fleet = fleet
        self.router = router
        self.cost_model = cost_model or CostModel()
        self.config = config or DispatchConfig()
        self._prior = profile or BackendProfile()
        self._profiles: dict[str, ProfileEstimator] = {}
        # Replies each backend's speed has been learned from, kept up to date as TPOTs come in
        # (`RouteContext.measured`: one mapping for every decision, not one built per decision).
        self._replies: dict[str, int] = {}
        self._prefix = PrefixIndex(self.config.prefix_index_blocks)
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._queues: dict[str, AdmissionQueue[Waiting]] = {}
        self._drain = DrainRate(self.config.drain_tau_s)
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._committed: dict[str, int] = {}  # peak blocks of in-flight requests, by backend
        self._work: dict[str, BackendWork] = {}  # what this gateway sent, by backend

    # The request's path.

    def submit(self, job: Job, now: float) -> Dispatch | Waiting | Rejection:
        """Decide for one arriving request: dispatched now, queued, or rejected."""
        cost = self.cost_model.estimate(job.model, job.prompt, job.max_tokens)
        if job.prompt_tokens is not None:
            cost = replace(cost, prompt_tokens=max(1, job.prompt_tokens), exact=True)
        chain = prefix_chain(job.prompt, model=job.model, cache_salt=job.cache_salt,
                             block_chars=self.config.prefix_block_chars)
        survey = self._survey(job, cost, chain, now, exclude=())
        if not survey.candidates:
            return self._no_backend(job, 0.0, None)
        if not self.config.admission:
            return self._dispatch(job, cost, chain, survey, now, None, 1, ())
        queue = self._queue(job.model)
        verdict = admit(any_fits=survey.any_fits, all_oversized=survey.all_oversized,
                        priority=job.priority, tenant=job.tenant, queue=queue,
                        drain_per_s=self._drain.per_second(now))
        if verdict.verdict is Verdict.ADMIT:
            return self._dispatch(job, cost, chain, survey, now, None, 1, ())
        if verdict.verdict is Verdict.QUEUE:
            if survey.over_slo and self.config.slo_wait_s <= 0.0:
                return self._over_slo(job, survey, queue, now, 0.0, None)
            waiting = Waiting(job, cost, chain, now)
            queue.push(waiting, priority=job.priority, tenant=job.tenant, now=now)
            return waiting
        code = QUEUE_FULL if queue.depth >= queue.max_depth else TENANT_QUEUE_FULL
        return self._reject(job, verdict.status or 429, code, verdict.reason,
                            verdict.retry_after_s, 0.0, None)

    def pump(self, now: float) -> Pumped:
        """Expire queued requests past the timeout, then dispatch queue heads while they are
        admissible somewhere. Call after `finish`, after each scrape and at `next_deadline()`."""
        rejected: list[Rejection] = []
        dispatched: list[Dispatch] = []
        timeout = self.config.queue_timeout_s
        for queue in self._queues.values():
            for waiting in queue.expired(now, timeout):
                decision = timed_out(queue.depth, self._drain.per_second(now))
                rejected.append(self._reject(
                    waiting.job, decision.status or 503, QUEUE_TIMEOUT,
                    f"waited {now - waiting.enqueued_at:.1f} s in the gateway queue, longer than "
                    f"the {timeout:g} s timeout", decision.retry_after_s,
                    now - waiting.enqueued_at, waiting))
            while (head := queue.peek_next()) is not None:
                survey = self._survey(head.job, head.cost, head.chain, now, exclude=())
                if not survey.any_fits and not survey.all_oversized:
                    waited = now - head.enqueued_at
                    if not (survey.over_slo and waited >= self.config.slo_wait_s):
                        break  # the head waits for capacity; nothing behind it overtakes
                    queue.pop_next()
                    rejected.append(self._over_slo(head.job, survey, queue, now, waited, head))
                    continue
                queue.pop_next()
                self._drain.record(now)
                out = self._dispatch(head.job, head.cost, head.chain, survey, now, head, 1, ())
                if isinstance(out, Dispatch):
                    dispatched.append(out)
                else:
                    rejected.append(out)
        return Pumped(tuple(dispatched), tuple(rejected))

    def cancel(self, waiting: Waiting, now: float) -> bool:
        """The client of a queued request went away: drop it without dispatch. False when it is
        no longer queued (already dispatched or expired: the caller then finishes that)."""
        queue = self._queues.get(waiting.job.model)
        if queue is None or not queue.remove(waiting):
            return False
        self._counts[(self.router.name, NO_BACKEND, CANCELLED)] += 1
        return True

    def reroute(self, dispatch: Dispatch, now: float) -> Dispatch | None:
        """After a failure before the first byte: finish `dispatch` (no feedback) and dispatch
        again on an admissible backend not tried yet; None when there is none (the caller reports
        the failure). Never queues: the client has already waited once."""
        self.finish(dispatch, now)
        survey = self._survey(dispatch.job, dispatch.cost, dispatch.chain, now,
                              exclude=dispatch.tried)
        if not survey.pool:
            return None
        out = self._dispatch(dispatch.job, dispatch.cost, dispatch.chain, survey, now,
                             dispatch.waiting, dispatch.attempt + 1, dispatch.tried,
                             queue_wait_s=dispatch.queue_wait_s, reason=RETRY)
        return out if isinstance(out, Dispatch) else None

    def set_usage(self, dispatch: Dispatch, prompt_tokens: int, completion_tokens: int) -> None:
        """Usage reported while the request still runs: its reservation becomes what it holds now
        plus what it is still expected to add."""
        if dispatch.finished:
            return
        expected = max(completion_tokens, dispatch.cost.output_p90, math.ceil(
            dispatch.cost.output_mean))
        dispatch.lease.set_blocks(-(-(prompt_tokens + expected) // dispatch.block_size))

    def first_token(self, dispatch: Dispatch, now: float) -> None:
        """The attempt's first token arrived at `now`: the earliest reading of the backend's
        speed (`ProfileEstimator.observe_ttft`). Optional; call at most once per attempt."""
        pred = dispatch.prediction
        if pred is not None and not dispatch.finished:
            self._estimator(dispatch.backend_id).observe_ttft(pred, now - dispatch.dispatched_at)

    def finish(self, dispatch: Dispatch, now: float, completion: Completion | None = None) -> None:
        """The attempt is over: release its lease (once; later calls do nothing) and learn from
        `completion`. Then call `pump(now)`: capacity may have freed."""
        if dispatch.finished:
            return
        dispatch.finished = True
        dispatch.lease.release()
        self._committed[dispatch.backend_id] -= dispatch.committed_blocks
        self._work_of(dispatch.backend_id).finished(dispatch.context_tokens)
        if completion is None:
            return
        calibrate = dispatch.job.prompt_tokens is None  # token-id prompts have no characters
        self.cost_model.observe(
            dispatch.cost,
            prompt_tokens=completion.prompt_tokens if calibrate else None,
            completion_tokens=completion.completion_tokens,
        )
        pred = dispatch.prediction
        if pred is None:
            return
        tpot = completion.decode_tpot(pred.predicted_ttft_s)
        if tpot is not None and tpot > 0.0:
            # Past the first few, TTFTs are not learned from: they include queueing (ttft.py).
            estimator = self._estimator(dispatch.backend_id)
            estimator.observe_tpot(pred.kv_read_tokens, pred.prefill_tokens_per_s, tpot)
            self._replies[dispatch.backend_id] = estimator.replies

    # Reading.

    def next_deadline(self, now: float) -> float | None:
        """When `pump` next has something to answer: the longest-waiting queued request times
        out, or (SLO admission) a queue head reaches `slo_wait_s`, if that is still ahead.
        None with nothing queued."""
        waits = [q.oldest_wait(now) for q in self._queues.values() if q.depth]
        if not waits:
            return None
        deadline = now - max(waits) + self.config.queue_timeout_s
        if self.config.admission and self.config.tpot_slo_s is not None:
            for queue in self._queues.values():
                head = queue.peek_next()
                if head is not None and now < head.enqueued_at + self.config.slo_wait_s:
                    deadline = min(deadline, head.enqueued_at + self.config.slo_wait_s)
        return deadline

    @property
    def queue_depth(self) -> int:
        return sum(q.depth for q in self._queues.values())

    def queue_depths(self) -> dict[str, int]:
        """Queued requests by model."""
        return {model: q.depth for model, q in self._queues.items() if q.depth}

    def decision_counts(self) -> Mapping[tuple[str, str, str], int]:
        """Decisions so far by (policy, backend id or "-", reason): a read-only view that grows."""
        return self._counts

    def profile(self, backend_id: str) -> BackendProfile:
        return self._estimator(backend_id).profile()

    def learned_speed(self, backend_id: str) -> tuple[float | None, int]:
        """The backend's learned speed as a scale on the reference profile's step times (above 1
        slower; None until a first token or a reply has been measured: the slow-start guess is
        not a measurement), and how many replies' TPOTs it has learned from."""
        estimator = self._profiles.get(backend_id)
        if estimator is None or not estimator.calibrated:
            return None, 0
        return estimator.scale, estimator.replies

    # Internals.

    def _queue(self, model: str) -> AdmissionQueue[Waiting]:
        queue = self._queues.get(model)
        if queue is None:
            queue = AdmissionQueue[Waiting](self.config.queue_max_depth,
                                            max_per_tenant=self.config.queue_max_per_tenant)
            self._queues[model] = queue
        return queue

    def _estimator(self, backend_id: str) -> ProfileEstimator:
        estimator = self._profiles.get(backend_id)
        if estimator is None:
            estimator = self._profiles[backend_id] = ProfileEstimator(self._prior)
        return estimator

    def _work_of(self, backend_id: str) -> BackendWork:
        work = self._work.get(backend_id)
        if work is None:
            work = self._work[backend_id] = BackendWork()
        return work

    def _survey(self, job: Job, cost: RequestCost, chain: PrefixChain, now: float,
                exclude: Sequence[str]) -> _Survey:
        candidates = self.fleet.candidates(job.model, now)
        if exclude:
            candidates = [c for c in candidates if c.spec.id not in exclude]
        matched = self._prefix.matches(chain) if chain.blocks else {}
        predictions: dict[str, Prediction] = {}
        commits: dict[str, int] = {}
        uncached: dict[str, int] = {}
        high_water = self.config.high_water
        max_risk = self.config.max_preemption_risk
        committed = self._committed
        peak = cost.peak_tokens
        fitting: list[Candidate] = []
        slo = self.config.tpot_slo_s if self.config.admission else None
        exempt = self.config.slo_exempt_priority
        if exempt is not None and job.priority >= exempt:
            slo = None
        kv_fits = False
        retry: float | None = None
        for c in candidates:
            cid = c.spec.id
            depth = matched.get(cid, 0)
            cached = cost.prefix_tokens(chain.chars(depth)) if depth else 0
            estimator = self._profiles.get(cid) or self._estimator(cid)
            uncached[cid] = max(0, cost.prompt_tokens - cached)
            pred = predict(c, cost, cached, estimator.profile(), high_water=high_water,
                           work=self._work.get(cid) or self._work_of(cid), now=now)
            predictions[cid] = pred
            # What this request adds to the backend's committed peak: its uncached prompt and
            # its expected reply (cached prefix blocks are shared with whoever cached them).
            commit = commits[cid] = -(-(peak - cached) // _block_size(c))
            capacity = _capacity(c)
            if is_admissible(pred, max_risk) and (
                capacity is None or committed.get(cid, 0) + commit <= high_water * capacity
            ):
                kv_fits = True
                if slo is None or c.inflight == 0 or not estimator.calibrated:
                    fitting.append(c)
                    continue
                limit = tpot_limit(slo, pred)
                if pred.tpot_others_s <= limit:
                    fitting.append(c)
                elif not fitting:
                    wait = recovery_s(pred, limit)
                    if wait is not None and (retry is None or wait < retry):
                        retry = wait
        all_oversized = bool(candidates) and all(p.oversized for p in predictions.values())
        if not self.config.admission:
            pool, reason = candidates, UNCHECKED
        elif fitting:
            pool, reason = fitting, ADMITTED
        elif all_oversized:
            pool, reason = candidates, OVERSIZED
        else:
            pool, reason = [], ADMITTED
        over = kv_fits and not fitting
        return _Survey(candidates, predictions, matched, commits, uncached, pool, reason,
                       bool(fitting), all_oversized, over, retry if over else None)

    def _dispatch(self, job: Job, cost: RequestCost, chain: PrefixChain, survey: _Survey,
                  now: float, waiting: Waiting | None, attempt: int, tried: tuple[str, ...],
                  *, queue_wait_s: float | None = None, reason: str | None = None
                  ) -> Dispatch | Rejection:
        wait = (now - waiting.enqueued_at if waiting is not None else 0.0) \
            if queue_wait_s is None else queue_wait_s
        ctx: RouteContext = build_context(
            survey.pool, cost, predictions=survey.predictions, chain=chain,
            matched_blocks=survey.matched, session_backend=self._session_backend(job.session),
            max_risk=self.config.max_preemption_risk, measured=self._replies)
        request = RouteRequest(model=job.model, prompt_tokens=cost.prompt_tokens,
                               max_tokens=job.max_tokens, stream=job.stream, context=ctx)
        try:
            decision = self.router.route(request, survey.pool)
        except NoCandidate as exc:
            return self._no_backend(job, wait, waiting, exc.reason)
        backend = decision.backend_id
        block_size = _block_size(decision.backend)
        lease = self.fleet.lease(backend, cost.reserve_blocks(block_size), now).acquire()
        commit = survey.commits.get(backend, 0)
        context = cost.prompt_tokens + 0.5 * cost.output_mean
        self._work_of(backend).dispatched(now, survey.uncached.get(backend, 0), context,
                                          self._estimator(backend).profile().prefill_tokens_per_s)
        self._committed[backend] = self._committed.get(backend, 0) + commit
        if chain.blocks:
            self._prefix.record(backend, chain)
        if job.session is not None:
            self._sessions[job.session] = backend
            self._sessions.move_to_end(job.session)
            if len(self._sessions) > self.config.sessions:
                self._sessions.popitem(last=False)
        why = reason or (QUEUED if waiting is not None and survey.reason == ADMITTED
                         else survey.reason)
        self._counts[(decision.policy, backend, why)] += 1
        return Dispatch(job=job, cost=cost, chain=chain, decision=decision,
                        prediction=survey.predictions.get(backend), lease=lease,
                        dispatched_at=now, queue_wait_s=wait, attempt=attempt,
                        tried=(*tried, backend), waiting=waiting, reason=why,
                        block_size=block_size, committed_blocks=commit,
                        context_tokens=context)

    def _over_slo(self, job: Job, survey: _Survey, queue: AdmissionQueue[Waiting], now: float,
                  wait: float, waiting: Waiting | None) -> Rejection:
        """429 with a Retry-After of when the soonest backend is back under the SLO, if nothing
        else arrived (whole seconds, clamped as the queue's); the queue's drain pace when the
        decay of the prefill load alone cannot get any there."""
        if survey.slo_retry_s is not None:
            retry = min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(survey.slo_retry_s)))
        else:
            retry = retry_after_s(queue.depth, self._drain.per_second(now))
        return self._reject(
            job, 429, OVER_SLO,
            f"every backend that could take the request is at its {self.config.tpot_slo_s} s "
            "TPOT SLO", retry, wait, waiting)

    def _session_backend(self, session: str | None) -> str | None:
        return None if session is None else self._sessions.get(session)

    def _no_backend(self, job: Job, wait: float, waiting: Waiting | None,
                    why: str | None = None) -> Rejection:
        message = why or f"no healthy backend serves {job.model!r}"
        return self._reject(job, 503, NO_HEALTHY_BACKEND, message, None, wait, waiting)

    def _reject(self, job: Job, status: int, code: str, message: str, retry_after_s: int | None,
                wait: float, waiting: Waiting | None) -> Rejection:
        self._counts[(self.router.name, NO_BACKEND, code)] += 1
        return Rejection(job, status, code, message, retry_after_s, wait, waiting)


def _block_size(candidate: Candidate) -> int:
    """The backend's KV block size in tokens (1 for a token budget such as TGI's)."""
    snap = candidate.snapshot
    if snap is not None and snap.block_size:
        return snap.block_size
    if (snap is None or not snap.kv_total_blocks) and candidate.spec.max_batch_total_tokens:
        return 1
    return DEFAULT_BLOCK_SIZE


def _capacity(candidate: Candidate) -> int | None:
    """KV capacity in the backend's blocks (a TGI token budget in tokens); None if unknown."""
    snap = candidate.snapshot
    if snap is not None and snap.kv_total_blocks:
        return snap.kv_total_blocks
    return candidate.spec.max_batch_total_tokens


__all__ = [
    "ADMITTED", "CANCELLED", "DEFAULT_TENANT", "NO_BACKEND", "NO_HEALTHY_BACKEND", "OVERSIZED",
    "OVER_SLO", "QUEUED", "QUEUE_FULL", "QUEUE_TIMEOUT", "RETRY", "TENANT_QUEUE_FULL", "UNCHECKED",
    "Completion", "Dispatch", "DispatchConfig", "Dispatcher", "FleetLike", "Job", "Pumped",
    "Rejection", "Waiting",
]
