"""The per-request routing cycle, and the gateway queue's lifecycle, as one pure conductor.

`Dispatcher` is what both the live gateway (from asyncio) and the offline fleet simulation (from a
discrete-event loop) call. It never reads a clock, never awaits and draws randomness only from the
router's injected Random: every method takes `now` (monotonic seconds, the Fleet's clock).

The cycle for one request (`submit`), each stage its own module:
  1. cost estimate (routing/cost.py) and prefix chain (routing/prefix.py);
  2. candidates: the Fleet's healthy backends serving the model;
  3. data producer (routing/scheduling/facts.py): per candidate, the TTFT prediction and its
     parts, KV fit, preemption risk, prefix match, the committed peak it would add;
  4. admission (routing/scheduling/admission.py): which candidates may take it now, and then
     routing/admission.py's verdict: admit now | queue | reject 429;
  5. the router (routing/policy.py, composed in routing/policies.py): pure filters, scorers over
     the whole list, one picker, over the cycle state (routing/scheduling/cycle.py);
  6. a ledger lease of the request's KV hold (`RequestCost.hold`, pooled with the others there:
     routing/kv_hold.py) on the chosen backend (grown by `grow` when a reply outgrows it);
  7. learning hooks (routing/scheduling/learning.py, and the policy's own): the prefix index,
     the session table, the backend's work record, the prompt-size window, the probes sent.
Queued requests (`Waiting`) leave through `pump` (dispatched once the head of their model's
queue is admissible somewhere; 503 past the queue timeout; 429 once they waited out `slo_wait_s`
for a backend within the SLO) or `cancel` (the client left); the caller pumps whenever capacity
may have freed and at `next_deadline(now)`. `finish` releases the lease exactly once and runs the
completion hooks (cost calibration, output lengths, the backend's speed); `first_token`
calibrates a backend the gateway has only just met.

Rules
- A model with no backend available (each unreachable, ejected or held off, routing/outlier.py)
  gets 503 `no_healthy_backend` at once, with a Retry-After of when the first is back (at least
  1 s); so do the requests queued for it when that happens.
- With admission off, every policy sees every healthy candidate and nothing queues.
- A request no backend can take within the TPOT SLO is refused with 429 (`OVER_SLO`) and a
  Retry-After of when the soonest backend would be back under it (`slo.recovery_s`), at once or
  after waiting up to `slo_wait_s`. The head of a model's queue is never overtaken, so a large
  request is not starved by smaller ones behind it.

The values it takes and returns live in routing/jobs.py and are re-exported here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

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
from routing.cost import CostModel, RequestCost
from routing.dispatch_config import DispatchConfig
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
from routing.kv_hold import Commitments, Hold, exact
from routing.ledger import Lease
from routing.policy import NoCandidate, Router
from routing.predict import lease_block_size
from routing.prefix import PrefixChain, PrefixIndex, prefix_chain
from routing.scheduling.admission import Admission, Admitted
from routing.scheduling.backends import BackendModels
from routing.scheduling.cycle import CycleState
from routing.scheduling.facts import Facts, FactsProducer, cached_tokens
from routing.scheduling.learning import (
    CostLearner,
    PrefixLearner,
    SessionTable,
    SpeedLearner,
    WorkLearner,
    moment_hooks,
)
from routing.state import Candidate
from routing.ttft import BackendProfile


class FleetLike(Protocol):
    """What the Dispatcher needs from routing.fleet.Fleet."""

    def candidates(self, model: str | None, now: float) -> list[Candidate]: ...
    def lease(self, backend_id: str, hold: Hold | int, now: float) -> Lease: ...
    def back_in(self, model: str | None, now: float) -> float | None: ...


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
        self._models = BackendModels(profile)
        prefix = PrefixIndex(self.config.prefix_index_blocks)
        self._facts = FactsProducer(self._models, prefix, high_water=self.config.high_water)
        self._admission = Admission(self.config.admission_params())
        self._sessions = SessionTable(self.config.sessions)
        self._on_dispatch, self._on_first_token, self._on_finish = moment_hooks((
            WorkLearner(self._models), PrefixLearner(prefix), self._sessions,
            CostLearner(self.cost_model), SpeedLearner(self._models)))
        self._queues: dict[str, AdmissionQueue[Waiting]] = {}
        self._drain = DrainRate(self.config.drain_tau_s)
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._committed = Commitments()  # pooled peak blocks of in-flight requests, by backend

    # The request's path.

    def submit(self, job: Job, now: float) -> Dispatch | Waiting | Rejection:
        """Decide for one arriving request: dispatched now, queued, or rejected."""
        cost = self.cost_model.estimate(job.model, job.prompt, job.max_tokens,
                                        min_tokens=job.min_tokens, ignore_eos=job.ignore_eos,
                                        prompt_tokens=job.prompt_tokens)
        chain = prefix_chain(job.prompt, model=job.model, cache_salt=job.cache_salt,
                             block_chars=self.config.prefix_block_chars)
        facts, admitted = self._survey(job, cost, chain, now, exclude=())
        if not facts.candidates:
            return self._no_backend(job, now, 0.0, None)
        if not self.config.admission:
            return self._dispatch(job, cost, chain, facts, admitted, now, None, 1, ())
        queue = self._queue(job.model)
        verdict = admit(any_fits=admitted.any_fits, all_oversized=admitted.all_oversized,
                        priority=job.priority, tenant=job.tenant, queue=queue,
                        drain_per_s=self._drain.per_second(now))
        if verdict.verdict is Verdict.ADMIT:
            return self._dispatch(job, cost, chain, facts, admitted, now, None, 1, ())
        if verdict.verdict is Verdict.QUEUE:
            if admitted.over_slo and self.config.slo_wait_s <= 0.0:
                return self._over_slo(job, admitted, queue, now, 0.0, None)
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
        for model, queue in self._queues.items():
            if queue.depth and not self.fleet.candidates(model, now):
                # No backend left for the model: nothing queued for it waits out the timeout.
                while (gone := queue.pop_next()) is not None:
                    rejected.append(self._no_backend(gone.job, now, now - gone.enqueued_at, gone))
                continue
            for waiting in queue.expired(now, timeout):
                decision = timed_out(queue.depth, self._drain.per_second(now))
                rejected.append(self._reject(
                    waiting.job, decision.status or 503, QUEUE_TIMEOUT,
                    f"waited {now - waiting.enqueued_at:.1f} s in the gateway queue, longer than "
                    f"the {timeout:g} s timeout", decision.retry_after_s,
                    now - waiting.enqueued_at, waiting))
            while (head := queue.peek_next()) is not None:
                facts, admitted = self._survey(head.job, head.cost, head.chain, now, exclude=())
                if not admitted.any_fits and not admitted.all_oversized:
                    waited = now - head.enqueued_at
                    if not (admitted.over_slo and waited >= self.config.slo_wait_s):
                        break  # the head waits for capacity; nothing behind it overtakes
                    queue.pop_next()
                    rejected.append(self._over_slo(head.job, admitted, queue, now, waited, head))
                    continue
                queue.pop_next()
                self._drain.record(now)
                out = self._dispatch(head.job, head.cost, head.chain, facts, admitted, now, head,
                                     1, ())
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
        facts, admitted = self._survey(dispatch.job, dispatch.cost, dispatch.chain, now,
                                       exclude=dispatch.tried)
        if not admitted.pool:
            return None
        out = self._dispatch(dispatch.job, dispatch.cost, dispatch.chain, facts, admitted, now,
                             dispatch.waiting, dispatch.attempt + 1, dispatch.tried,
                             queue_wait_s=dispatch.queue_wait_s, reason=RETRY)
        return out if isinstance(out, Dispatch) else None

    def first_token(self, dispatch: Dispatch, now: float) -> None:
        """The attempt's first token arrived at `now`: the earliest reading of the backend's
        speed. Optional; call at most once per attempt."""
        if not dispatch.finished:
            for hook in self._on_first_token:
                hook(dispatch, now)

    def finish(self, dispatch: Dispatch, now: float, completion: Completion | None = None) -> None:
        """The attempt is over: release its lease (once; later calls do nothing) and learn from
        `completion`. Then call `pump(now)`: capacity may have freed."""
        if dispatch.finished:
            return
        dispatch.finished = True
        dispatch.lease.release()
        self._committed.remove(dispatch.backend_id, dispatch.commit)
        for hook in self._on_finish:
            hook(dispatch, completion)

    def grow(self, dispatch: Dispatch, emitted: int, now: float) -> int | None:
        """The reply has emitted `emitted` tokens: past its lease's reservation, re-estimate the
        rest (`CostModel.reserve_from`) and grow the lease and committed peak to it. Returns the
        count at which to call again (None: the reservation covers the cap, or it is over)."""
        if dispatch.finished:
            return None
        cost = dispatch.cost
        size = dispatch.block_size
        held = dispatch.lease.blocks * size - cost.prompt_tokens  # output tokens reserved
        if emitted >= held:
            held = self.cost_model.reserve_from(cost, emitted)
            blocks = -(-(cost.prompt_tokens + held) // size)
            if blocks > dispatch.lease.blocks:
                dispatch.lease.set_blocks(blocks)
            if blocks > dispatch.commit.own:  # from now on held outright
                self._committed.remove(dispatch.backend_id, dispatch.commit)
                dispatch.commit = exact(blocks)
                self._committed.add(dispatch.backend_id, dispatch.commit)
            held = dispatch.lease.blocks * size - cost.prompt_tokens
        cap = cost.max_tokens
        return None if cap is not None and held >= cap else max(emitted + 1, held)

    # Reading.

    def next_deadline(self, now: float) -> float | None:
        """When `pump` next has something to answer: the longest-waiting queued request times
        out, or (SLO admission) a queue head reaches `slo_wait_s`, if that is still ahead.
        None with nothing queued."""
        waits = [q.oldest_wait(now) for q in self._queues.values() if q.depth]
        if not waits:
            return None
        deadline = now - max(waits) + self.config.queue_timeout_s
        if self.config.slo_gated:
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
        return self._models.estimator(backend_id).profile()

    def learned_speed(self, backend_id: str) -> tuple[float | None, int]:
        """The backend's learned speed scale on the reference profile (above 1 slower), pooled
        with its class's (routing/speed_pool.py), None before a measurement of its own; and how
        many replies it has learned from."""
        state = self._models.states.get(backend_id)
        if state is None or not state.estimator.calibrated:
            return None, 0
        return state.estimator.scale, state.estimator.replies

    # Internals.

    def _queue(self, model: str) -> AdmissionQueue[Waiting]:
        queue = self._queues.get(model)
        if queue is None:
            queue = AdmissionQueue[Waiting](self.config.queue_max_depth,
                                            max_per_tenant=self.config.queue_max_per_tenant)
            self._queues[model] = queue
        return queue

    def _survey(self, job: Job, cost: RequestCost, chain: PrefixChain, now: float,
                exclude: Sequence[str]) -> tuple[Facts, Admitted]:
        candidates = self.fleet.candidates(job.model, now)
        if exclude:
            candidates = [c for c in candidates if c.spec.id not in exclude]
        facts = self._facts.produce(candidates, cost, chain, now)
        return facts, self._admission.admit(facts, self._committed.held, job.priority)

    def _dispatch(self, job: Job, cost: RequestCost, chain: PrefixChain, facts: Facts,
                  admitted: Admitted, now: float, waiting: Waiting | None, attempt: int,
                  tried: tuple[str, ...], *, queue_wait_s: float | None = None,
                  reason: str | None = None) -> Dispatch | Rejection:
        wait = (now - waiting.enqueued_at if waiting is not None else 0.0) \
            if queue_wait_s is None else queue_wait_s
        cycle = CycleState(job.model, cost, max_tokens=job.max_tokens, stream=job.stream,
                           chain=chain, session_backend=self._sessions.backend_of(job.session),
                           predictions=facts.predictions, matched=facts.matched,
                           measured=self._models.replies, pool=admitted.pool,
                           admissible=admitted.admissible)
        try:
            decision = self.router.route(cycle, admitted.pool)
        except NoCandidate as exc:
            return self._no_backend(job, now, wait, waiting, exc.reason)
        backend = decision.backend_id
        chosen = decision.backend
        i = next(i for i, c in enumerate(facts.candidates) if c is chosen)
        block_size = lease_block_size(chosen)
        lease = self.fleet.lease(backend, cost.hold(block_size), now).acquire()
        cached = cached_tokens(cost, chain, facts.matched.get(backend, 0))
        commit = cost.hold(block_size, cached)  # cached prefix blocks: shared with their holder
        self._committed.add(backend, commit)
        why = reason or (QUEUED if waiting is not None and admitted.reason == ADMITTED
                         else admitted.reason)
        self._counts[(decision.policy, backend, why)] += 1
        dispatch = Dispatch(job=job, cost=cost, chain=chain, decision=decision,
                            prediction=facts.preds[i], lease=lease, dispatched_at=now,
                            queue_wait_s=wait, attempt=attempt, tried=(*tried, backend),
                            waiting=waiting, reason=why, block_size=block_size,
                            commit=commit,
                            context_tokens=cost.prompt_tokens + 0.5 * cost.output_mean)
        uncached = max(0, cost.prompt_tokens - cached)
        for hook in self._on_dispatch:
            hook(dispatch, uncached, now)
        self.router.dispatched(cycle, decision)
        return dispatch

    def _over_slo(self, job: Job, admitted: Admitted, queue: AdmissionQueue[Waiting], now: float,
                  wait: float, waiting: Waiting | None) -> Rejection:
        """429 with a Retry-After of when the soonest backend is back under the SLO, if nothing
        else arrived (whole seconds, clamped as the queue's); the queue's drain pace when the
        decay of the prefill load alone cannot get any there."""
        if admitted.slo_retry_s is not None:
            retry = min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S,
                                               math.ceil(admitted.slo_retry_s)))
        else:
            retry = retry_after_s(queue.depth, self._drain.per_second(now))
        return self._reject(
            job, 429, OVER_SLO,
            f"every backend that could take the request is at its {self.config.slo.tpot_s} s "
            "TPOT SLO", retry, wait, waiting)

    def _no_backend(self, job: Job, now: float, wait: float, waiting: Waiting | None,
                    why: str | None = None) -> Rejection:
        """503, Retry-After when the model's first backend is back (at least RETRY_AFTER_MIN_S)."""
        message = why or f"no healthy backend serves {job.model!r}"
        back = self.fleet.back_in(job.model, now)
        retry = RETRY_AFTER_MIN_S if back is None else max(RETRY_AFTER_MIN_S, math.ceil(back))
        return self._reject(job, 503, NO_HEALTHY_BACKEND, message, retry, wait, waiting)

    def _reject(self, job: Job, status: int, code: str, message: str, retry_after_s: int | None,
                wait: float, waiting: Waiting | None) -> Rejection:
        self._counts[(self.router.name, NO_BACKEND, code)] += 1
        return Rejection(job, status, code, message, retry_after_s, wait, waiting)


__all__ = ["ADMITTED", "CANCELLED", "DEFAULT_TENANT", "NO_BACKEND", "NO_HEALTHY_BACKEND",
           "OVERSIZED", "OVER_SLO", "QUEUED", "QUEUE_FULL", "QUEUE_TIMEOUT", "RETRY",
           "TENANT_QUEUE_FULL", "UNCHECKED", "Completion", "Dispatch", "DispatchConfig",
           "Dispatcher", "FleetLike", "Job", "Pumped", "Rejection", "Waiting"]
