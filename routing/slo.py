"""The gateway's one SLO (`SloTargets`: TTFT and TPOT targets, which admission, the goodput scorer
and the long-prompt offload all read), and SLO admission's arithmetic: the TPOT a backend is held
to, and how soon one past it will be back under it. Pure.

Every prompt a backend prefills stretches the decode steps of every reply running there
(routing/ttft.py), so past a point one more request makes all of them slow. SLO admission
(routing/scheduling/admission.py) lets a backend take a request only while the replies decoding
there are predicted to stay within the TPOT SLO with it there (`Prediction.tpot_others_s`: its
prefill stall and its KV read included), and the Dispatcher refuses what no backend can take
with a Retry-After of `recovery_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from routing.ttft import PREFILL_RATE_TAU_S, Prediction

DEFAULT_TTFT_S = 1.0  # the usual time-to-first-token SLO
DEFAULT_TPOT_S = 0.05  # the usual time-per-output-token SLO


@dataclass(frozen=True, slots=True)
class SloTargets:
    """What a request must get to count as served well: its first token within `ttft_s` and
    its reply at `tpot_s` per token or faster."""

    ttft_s: float = DEFAULT_TTFT_S
    tpot_s: float = DEFAULT_TPOT_S

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0.0 and self.tpot_s > 0.0):
            raise ValueError("the SLO targets must be > 0")

# A backend that cannot meet the TPOT SLO even alone is held to this many times its idle TPOT.
SLOW_BACKEND_FACTOR = 2.0


def tpot_limit(slo_s: float, pred: Prediction) -> float:
    """The TPOT the replies on the predicted backend are held to: the SLO, or for a backend too
    slow to meet it even alone, `SLOW_BACKEND_FACTOR` times its idle TPOT (one decode step
    reading no KV), so that it is gated under load instead of shut out."""
    return max(slo_s, SLOW_BACKEND_FACTOR * pred.tpot_idle_s)


def recovery_s(pred: Prediction, limit_s: float, tau_s: float = PREFILL_RATE_TAU_S
               ) -> float | None:
    """Seconds until the replies decoding on the predicted backend would be back within `limit_s`
    with this request there (`tpot_others_s`), if nothing else arrived meanwhile: the prefill
    load (`prefill_busy`, an exponential average over `tau_s`) decays as exp(-t / tau_s), and
    with it the stretch of every decode step. 0 when already within; None when the decay alone
    cannot get there (the KV read, or this prompt's own stall, is over the limit by itself)."""
    if pred.tpot_others_s <= limit_s:
        return 0.0
    stall = pred.tpot_others_s - pred.predicted_tpot_s
    step = pred.predicted_tpot_s * (1.0 - pred.prefill_busy)  # unstretched by prefill
    room = limit_s - stall
    if room <= step or pred.prefill_busy <= 0.0:
        return None
    fits_at = 1.0 - step / room  # the prefill share under which it is within the limit
    return tau_s * math.log(pred.prefill_busy / fits_at)
