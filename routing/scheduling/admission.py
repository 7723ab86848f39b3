"""Admissibility: which candidates may take the request now, beside the router (which then chooses
among them). Reads the cycle's facts; pure.

Rules
- The KV rule: a backend takes the request when its prediction fits under the KV high-water mark
  at a preemption risk of at most `max_preemption_risk` (a backend whose KV capacity is unknown
  cannot be judged and passes on its fit alone), and the committed peaks of the gateway's own
  requests in flight there plus this one's stay under the mark too. The second part covers what
  a scrape cannot show yet: requests accepted but not yet allocated, and the growth still ahead
  of running ones.
- SLO admission (`slo_tpot_s` set): a backend takes the request only if the replies decoding
  there are predicted to stay within the TPOT SLO with it there (`Prediction.tpot_others_s`: its
  prefill stall and its KV read included). Past that point one more request makes every reply
  there slow, so past the fleet's SLO capacity the gateway sheds the excess instead of letting
  every user miss. A backend with none of the gateway's requests in flight is not gated (there
  is nothing to protect there, and the fleet never stops serving); a backend too slow to meet
  the SLO even alone is held to `slow_backend_factor` times its own idle TPOT instead. Nor is a
  backend gated before its first speed reading: until then its speed is the slow-start guess,
  and a burst at start-up would be refused for a slowness nobody has seen. Requests of priority
  `exempt_priority` or higher are never gated.
- The pool handed to the router: the admissible backends; when none is and every backend is too
  small for the request even empty, all of them (the backend's own limits decide); otherwise
  none (the request waits or is refused). With admission off, every candidate, unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from routing.jobs import ADMITTED, OVERSIZED, UNCHECKED
from routing.scheduling.facts import Facts
from routing.slo import SLOW_BACKEND_FACTOR, recovery_s
from routing.state import Candidate
from routing.ttft import DEFAULT_HIGH_WATER, Prediction

DEFAULT_MAX_RISK = 0.1


def kv_admissible(prediction: Prediction, max_risk: float = DEFAULT_MAX_RISK) -> bool:
    """Fits under the high-water mark with an acceptable preemption risk (module rule)."""
    if prediction.free_blocks is None:  # KV capacity unknown: nothing to judge by
        return prediction.fits
    return prediction.fits and prediction.preemption_risk <= max_risk


@dataclass(frozen=True, slots=True)
class AdmissionParams:
    enabled: bool = True
    high_water: float = DEFAULT_HIGH_WATER  # fraction of a backend's KV blocks a request may fill
    max_preemption_risk: float = DEFAULT_MAX_RISK
    slo_tpot_s: float | None = None  # SLO admission's TPOT target; None: no SLO admission
    exempt_priority: int | None = None  # this class or higher is never SLO-gated
    slow_backend_factor: float = SLOW_BACKEND_FACTOR

    def __post_init__(self) -> None:
        if not 0.0 < self.high_water <= 1.0:
            raise ValueError("high_water must be in (0, 1]")
        if not 0.0 <= self.max_preemption_risk <= 1.0:
            raise ValueError("max_preemption_risk must be in [0, 1]")
        if self.slo_tpot_s is not None and not self.slo_tpot_s > 0.0:
            raise ValueError("the TPOT SLO must be > 0 (or None: no SLO admission)")
        if not self.slow_backend_factor > 0.0:
            raise ValueError("slow_backend_factor must be > 0")


class Admitted(NamedTuple):
    pool: list[Candidate]  # what the router may choose from
    reason: str  # ADMITTED, OVERSIZED or UNCHECKED when the pool is usable
    admissible: frozenset[str]  # pool backends that pass the KV rule
    any_fits: bool  # some backend takes it now (KV rule and, with SLO admission, the TPOT SLO)
    all_oversized: bool
    over_slo: bool  # some backend fits its KV, but every one of those is at its TPOT SLO
    slo_retry_s: float | None  # then: the soonest one is back under it (slo.recovery_s)


class Admission:
    def __init__(self, params: AdmissionParams | None = None) -> None:
        self.params = params or AdmissionParams()

    def admit(self, facts: Facts, committed: dict[str, int], priority: int) -> Admitted:
        """`committed`: the peak blocks of the gateway's requests in flight, by backend."""
        p = self.params
        high_water, max_risk = p.high_water, p.max_preemption_risk
        slo = p.slo_tpot_s if p.enabled else None
        if p.exempt_priority is not None and priority >= p.exempt_priority:
            slo = None
        factor = p.slow_backend_factor
        candidates = facts.candidates
        fitting: list[Candidate] = []
        kv_ok: list[bool] = []
        kv_fits = False
        retry: float | None = None
        all_oversized = bool(candidates)
        for c, pred, commit, cap, calibrated in zip(candidates, facts.preds, facts.commits,
                                                     facts.capacities, facts.calibrated,
                                                     strict=True):
            if not pred.oversized:
                all_oversized = False
            # kv_admissible, inlined: this runs for every candidate of every decision.
            ok = pred.fits and (pred.free_blocks is None or pred.preemption_risk <= max_risk)
            kv_ok.append(ok)
            if ok and (cap is None or committed.get(c.spec.id, 0) + commit <= high_water * cap):
                kv_fits = True
                if slo is None or c.inflight == 0 or not calibrated:
                    fitting.append(c)
                    continue
                limit = max(slo, factor * pred.tpot_idle_s)
                if pred.tpot_others_s <= limit:
                    fitting.append(c)
                elif not fitting:
                    wait = recovery_s(pred, limit)
                    if wait is not None and (retry is None or wait < retry):
                        retry = wait
        if not p.enabled:
            pool, reason = candidates, UNCHECKED
        elif fitting:
            pool, reason = fitting, ADMITTED
        elif all_oversized:
            pool, reason = candidates, OVERSIZED
        else:
            pool, reason = [], ADMITTED
        if pool is fitting:
            admissible = frozenset(c.spec.id for c in fitting)
        else:
            admissible = frozenset(c.spec.id for c, ok in zip(candidates, kv_ok, strict=True)
                                   if ok)
        over = kv_fits and not fitting
        return Admitted(pool, reason, admissible, bool(fitting), all_oversized, over,
                        retry if over else None)
