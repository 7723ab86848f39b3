"""Each backend's speed, learned online: `ProfileEstimator` keeps one scale on the reference
`BackendProfile` (routing/ttft.py) from the first tokens and the TPOTs the gateway measures.

A backend not measured yet is taken as `SLOW_START_SCALE` times slower than the reference, so an
unknown card is eased in (as a load balancer's slow start does) rather than flooded. Its first
tokens set its speed until `BOOTSTRAP_TPOTS` replies have ended; from then on only TPOTs count
(a later TTFT includes queueing inside the engine, which would read as slow prefill). Pure: the
observations are passed in.
"""

from __future__ import annotations

import math

from routing.ttft import BOOTSTRAP_TPOTS, SLOW_START_SCALE, BackendProfile, Prediction


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
    would set the speed for every other: on a mixed fleet it read the fast cards slower and the
    slow ones faster than their typical replies.
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
