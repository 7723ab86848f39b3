"""Each backend's speed, learned online: `ProfileEstimator` keeps one scale on the reference
`BackendProfile` (routing/ttft.py) from the first tokens and the TPOTs the gateway measures.

A backend not measured yet is taken as `SLOW_START_SCALE` times slower than the reference, so an
unknown card is eased in (as a load balancer's slow start does) rather than flooded. Its first
tokens set its speed until `BOOTSTRAP_TPOTS` replies have ended; from then on only TPOTs count
(a later TTFT includes queueing inside the engine, which would read as slow prefill).

Its own estimate is robust: the median of its last `window` readings, so one reply from a
loaded host moves it by at most one rank. The scale a policy reads is that estimate pooled with
its class's (routing/speed_pool.py): shrunk toward the class's pooled estimate by the backend's
confidence, n / (n + shrink) for n readings, within a band that confidence sets; a backend
alone in its class is its own pool. Pure: the observations and the class's estimate are passed
in.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

from routing.speed_pool import (
    MAX_CLASS_SPREAD,
    PRIOR_WEIGHT,
    SHRINK_READINGS,
    PoolParams,
    SpeedReading,
    class_log_scale,
    confidence,
    shrunk_log_scale,
)
from routing.ttft import BOOTSTRAP_TPOTS, SLOW_START_SCALE, BackendProfile, Prediction

DEFAULT_WINDOW = 64  # recent readings a backend's own estimate is the median of
MIN_LOG_SCALE, MAX_LOG_SCALE = math.log(0.01), math.log(100.0)  # a scale is held in [1/100, 100]


class ProfileEstimator:
    """Learns one backend's speed online from the first tokens and TPOTs the gateway measures.

    The backend is taken to be the prior profile run `scale` times slower (faster below 1): on
    one model, a GPU's memory bandwidth (decode) and compute (prefill) come in proportion within
    a factor of about 1.5 across current cards, while their ratio is what the data cannot
    separate (a TPOT stretched by prefills reads alike as slow decode or slow prefill, and the
    two loads rise together). One scale is identified robustly from few samples. A reply's TPOT
    is its mean step, so with the prior's coefficients
        tpot = scale x (base + per_kv_token x kv_read + prefill load x tpot / prefill speed)
    which is linear in `scale`, so each observation gives one reading of it: observed over
    modelled time. The backend's own estimate is the median of the logs of its last `window`
    readings (TPOTs only, once `BOOTSTRAP_TPOTS` have come in): the typical reply's speed, which
    neither the few replies that ran under the heaviest prefill load (where the model is least
    exact) nor one reply stretched by the host's contention can carry off. A mean, and more so
    a least-squares ratio, would let them set the speed for every other.
    """

    def __init__(
        self,
        prior: BackendProfile | None = None,
        *,
        window: int = DEFAULT_WINDOW,
        prior_weight: float = PRIOR_WEIGHT,
        initial_scale: float = SLOW_START_SCALE,
        shrink: float = SHRINK_READINGS,
        max_log_spread: float = math.log(MAX_CLASS_SPREAD),
    ) -> None:
        if not (prior_weight > 0.0 and initial_scale > 0.0 and window >= 1 and shrink > 0.0):
            raise ValueError("prior_weight, initial_scale, window and shrink must be > 0")
        self._prior = prior or BackendProfile()
        self.params = PoolParams(math.log(initial_scale), prior_weight, shrink, max_log_spread)
        self._ttft_logs: deque[float] = deque(maxlen=window)  # first tokens' log readings
        self._tpot_logs: deque[float] = deque(maxlen=window)  # replies' log readings
        self._class_log: float | None = None  # the class's pooled log scale; None: alone
        self._class_tau2: float | None = None  # the class's real spread (`between_variance`)
        self._reading = SpeedReading(None, 0)
        self._log_scale = self.params.prior_log_scale
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
        self._ttft_logs.append(_log_ratio(y / z))
        self._learned()

    def observe_tpot(self, kv_read_tokens: float, prefill_tokens_per_s: float,
                     seconds: float) -> None:
        """One reply's time per output token; `kv_read_tokens` and `prefill_tokens_per_s` as
        predicted at its dispatch (`Prediction.kv_read_tokens`, `.prefill_tokens_per_s`)."""
        if not 0.0 < seconds < math.inf:
            return
        p = self._prior
        z = p.decode_step_s(kv_read_tokens) + prefill_tokens_per_s * seconds / (
            p.prefill_tokens_per_s)
        self._tpot_logs.append(_log_ratio(seconds / z))
        self._tpots += 1
        self._learned()

    def pool_with(self, class_log_scale: float | None, tau2: float | None = None) -> None:
        """The class's pooled log scale (routing/speed_pool.py), which this backend's scale is
        shrunk toward, and its members' real spread (`between_variance`); None: it is alone,
        its own pool."""
        self._class_log, self._class_tau2 = class_log_scale, tau2
        self._settle()

    def _learned(self) -> None:
        self._readings += 1
        # The median is over the window; the confidence counts every reading behind it.
        if self._tpots >= BOOTSTRAP_TPOTS:
            logs, n = list(self._tpot_logs), self._tpots
        else:
            logs, n = [*self._ttft_logs, *self._tpot_logs], self._readings
        mid = median(logs)
        self._reading = SpeedReading(mid, n, median_variance(logs, mid))
        self._settle()

    def _settle(self) -> None:
        params, own = self.params, self._reading
        pooled = class_log_scale((own,), params) if self._class_log is None else self._class_log
        self._log_scale = min(MAX_LOG_SCALE, max(MIN_LOG_SCALE,
                                                 shrunk_log_scale(own, pooled, params,
                                                                  self._class_tau2)))
        self._profile = None

    @property
    def reading(self) -> SpeedReading:
        """The backend's own robust estimate, before pooling with its class."""
        return self._reading

    @property
    def confidence(self) -> float:
        """How far its own estimate counts against its class's (0..1, grows with readings)."""
        return confidence(self._reading.readings, self.params)

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
    def own_scale(self) -> float:
        """The backend's own estimate as a scale (the slow-start guess before any reading)."""
        own = self._reading.log_scale
        return math.exp(self.params.prior_log_scale if own is None else own)

    @property
    def scale(self) -> float:
        """The scale policies read: its own estimate pooled with its class's."""
        return math.exp(self._log_scale)

    def profile(self) -> BackendProfile:
        if self._profile is None:
            p, scale = self._prior, self.scale
            self._profile = BackendProfile(p.prefill_tokens_per_s / scale, p.overhead_s,
                                           p.decode_base_s * scale,
                                           p.decode_per_kv_token_s * scale)
        return self._profile


def median_variance(logs: list[float], mid: float) -> float:
    """The sampling variance of the median of `logs`: (pi / 2) sigma^2 / n, sigma estimated
    robustly as 1.4826 x the median absolute deviation (a normal's standard deviation)."""
    sigma = 1.4826 * median([abs(x - mid) for x in logs])
    return math.pi / 2.0 * sigma * sigma / len(logs)


def _log_ratio(ratio: float) -> float:
    """One reading, as a log, held within the scale's bounds."""
    if not ratio > 0.0:
        return MIN_LOG_SCALE
    return min(MAX_LOG_SCALE, max(MIN_LOG_SCALE, math.log(ratio)))
