"""The goodput scorer: the expected change in requests meeting both SLOs (goodput counts exactly
those) if this backend takes the request:
    gain = P(TTFT <= ttft target) x P(TPOT <= tpot target | this request there)
           - (sequences there) x (P(their TPOT meets it) before - after)
scored 1 / (2 - gain): 1 for a sure success that costs nobody theirs, 1/2 for a sure miss that
costs nobody, towards 0 as the misses it causes grow (never flat, so the least harmful backend
still wins when the request cannot succeed anywhere).

Predictions scatter log-normally around the truth (`ttft_spread`, `tpot_spread`: sigma of
log(actual / predicted)). The TPOT a decode sees is stretched by every prefill interleaved with
it, so a long prompt costs the replies already decoding on a backend: a fast backend near the
TPOT target loses to a slower one with room, and a slow backend whose TTFT would miss loses
whatever its TPOT. The targets are the gateway's one SLO (routing/slo.py `SloTargets`). Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routing.scheduling.cycle import CycleState
from routing.slo import SloTargets
from routing.state import Candidate

_MEMO_SIZE = 4096  # TPOTs-before remembered (a fleet's backends times their recent states)


@dataclass(frozen=True, slots=True)
class GoodputParams:
    ttft_spread: float = 0.5  # sigma of log(actual / predicted TTFT)
    tpot_spread: float = 0.35  # and of TPOT

    def __post_init__(self) -> None:
        if not min(self.ttft_spread, self.tpot_spread) > 0.0:
            raise ValueError("the goodput spreads must be > 0")


class GoodputScorer:
    def __init__(self, slo: SloTargets | None = None, params: GoodputParams | None = None
                 ) -> None:
        slo = slo or SloTargets()
        params = params or GoodputParams()
        self._ttft = (math.log(slo.ttft_s), params.ttft_spread * math.sqrt(2.0))
        self._tpot = (math.log(slo.tpot_s), params.tpot_spread * math.sqrt(2.0))
        self._before: dict[float, float] = {}  # P(TPOT before <= target), by TPOT before

    def score(self, cycle: CycleState, candidates: list[Candidate]) -> list[float]:
        ttft_log, ttft_scale = self._ttft
        tpot_log, tpot_scale = self._tpot
        erfc, log, inf = math.erfc, math.log, math.inf
        memo = self._before
        out: list[float] = []
        for pred in cycle.predictions_of(candidates):
            if pred is None:
                out.append(0.0)
                continue
            # P(actual <= target) of each figure, for actual scattering log-normally around it:
            # 0.5 erfc((log predicted - log target) / (spread sqrt 2)); 1 at or below 0, 0 at inf.
            x = pred.predicted_tpot_s
            after = 1.0 if x <= 0.0 else (
                0.5 * erfc((log(x) - tpot_log) / tpot_scale) if x < inf else 0.0)
            x = pred.predicted_ttft_s
            own = (1.0 if x <= 0.0 else (
                0.5 * erfc((log(x) - ttft_log) / ttft_scale) if x < inf else 0.0)) * after
            batch = pred.tpot_batch - 1
            if batch <= 0:  # nobody else there: nothing to lose
                out.append(1.0 / (2.0 - own + 0.0))
                continue
            x = pred.tpot_others_s
            others = 1.0 if x <= 0.0 else (
                0.5 * erfc((log(x) - tpot_log) / tpot_scale) if x < inf else 0.0)
            # The TPOT before this request is the backend's alone (its cached load's), so its
            # probability is kept by value across decisions.
            x = pred.tpot_before_s
            before = memo.get(x)
            if before is None:
                before = 1.0 if x <= 0.0 else (
                    0.5 * erfc((log(x) - tpot_log) / tpot_scale) if x < inf else 0.0)
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                memo[x] = before
            lost = (before - others if before > others else 0.0) * batch
            out.append(1.0 / (2.0 - own + lost))
        return out
