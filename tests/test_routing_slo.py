"""SLO admission's arithmetic (routing/slo.py): the TPOT a backend is held to, and when one past
it is back under it as its prefill load decays."""

from __future__ import annotations

import math

import pytest

from routing.slo import SLOW_BACKEND_FACTOR, recovery_s, tpot_limit
from routing.ttft import Prediction


def _loaded(step_s: float, busy: float, stall_s: float) -> Prediction:
    """A prediction whose unstretched decode step is `step_s`, under a prefill share `busy`,
    with this prompt's own stall adding `stall_s` to the others' TPOT."""
    tpot = step_s / (1.0 - busy)
    return Prediction(0, 0, 0, 0, 0.1, 0.0, True, False, 100, 0, 0, "x", 10, tpot, busy,
                      tpot, 0.0, 0.0, tpot + stall_s, step_s, busy)


def test_slo_recovery_is_the_decay_of_the_prefill_load_down_to_what_fits() -> None:
    # 10 ms steps stretched by a prefill share of 0.8 to 50 ms, plus 2 ms of this prompt's
    # stall: within 30 ms once the share is 1 - 10 / 28, after tau x ln(0.8 / that).
    pred = _loaded(0.010, 0.8, 0.002)
    fits_at = 1.0 - 0.010 / 0.028
    assert recovery_s(pred, 0.030, tau_s=5.0) == pytest.approx(5.0 * math.log(0.8 / fits_at))
    later = _loaded(0.010, fits_at, 0.002)  # the share decayed that far: exactly within
    assert later.tpot_others_s == pytest.approx(0.030)


def test_slo_recovery_is_zero_within_the_limit_and_none_when_decay_cannot_reach_it() -> None:
    assert recovery_s(_loaded(0.010, 0.5, 0.002), 0.030) == 0.0
    assert recovery_s(_loaded(0.035, 0.5, 0.002), 0.030) is None  # the KV read alone is over
    assert recovery_s(_loaded(0.010, 0.5, 0.025), 0.030) is None  # and so is its own stall


@pytest.mark.parametrize(
    ("idle_s", "limit_s"),
    [(0.010, 0.050), (0.025, 0.050), (0.040, SLOW_BACKEND_FACTOR * 0.040)],
    ids=["a fast backend is held to the SLO", "so is one at half the SLO alone",
         "one too slow for the SLO alone is held to twice its idle TPOT"],
)
def test_tpot_limit(idle_s: float, limit_s: float) -> None:
    assert tpot_limit(0.050, _loaded(idle_s, 0.0, 0.0)) == pytest.approx(limit_s)
