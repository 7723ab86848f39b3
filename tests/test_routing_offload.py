"""Long prompts to slower backends (routing/scheduling/offload.py): a prompt much longer than the
recent ones goes to a slower backend that can still start it soon and keep its replies within
the TPOT SLO; short prompts, one-speed fleets and workloads of one size are left alone. The
filter only reads; the window of recent sizes learns from dispatched requests."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from routing.cost import RequestCost
from routing.policy import Decision
from routing.scheduling.cycle import CycleState
from routing.scheduling.offload import OffloadParams, PrefillOffloadFilter, RecentSizes
from routing.slo import SloTargets
from routing.state import BackendSpec, Candidate
from routing.ttft import Prediction

MIN_SEEN = OffloadParams().min_seen

FAST, SLOW = 0.006, 0.023  # bare decode steps: an H100 and an L40S serving an 8B model


def cost() -> RequestCost:
    return RequestCost(
        model="m", prompt_chars=4000, prompt_tokens=1000, exact=False, tokens_per_char=0.25,
        max_tokens=None, output_p50=100, output_p90=100, output_mean=100.0, output_var=0.0,
        typical_prompt_tokens=1000.0, mean_output_all=100.0, inflight_growth_mean=0.0,
        inflight_growth_var=0.0)


def cand(backend_id: str) -> Candidate:
    spec = BackendSpec(backend_id, f"http://127.0.0.1/{backend_id}", ("m",))
    return Candidate(spec, True, None, True, 0, 0)


def pred(*, idle: float, prefill_s: float, ttft_s: float = 0.1, tpot_s: float = 0.03,
         others_s: float | None = None) -> Prediction:
    return Prediction(0.0, prefill_s, 0.0, 0.0, ttft_s, 0.0, True, False, 100, 0, 0, "x",
                      predicted_tpot_s=tpot_s, tpot_idle_s=idle,
                      tpot_others_s=tpot_s if others_s is None else others_s)


POOL = [cand("h1"), cand("h2"), cand("l1"), cand("l2")]


def request(predictions: Mapping[str, Prediction]) -> CycleState:
    return CycleState("m", cost(), predictions=predictions, pool=POOL,
                      admissible=frozenset(c.id for c in POOL))


def usual(prefill_s: float = 0.01) -> dict[str, Prediction]:
    """A prompt of the usual size: its prefill takes `prefill_s` on the fast backends, 3x on
    the slow."""
    return {"h1": pred(idle=FAST, prefill_s=prefill_s), "h2": pred(idle=FAST, prefill_s=prefill_s),
            "l1": pred(idle=SLOW, prefill_s=3 * prefill_s),
            "l2": pred(idle=SLOW, prefill_s=3 * prefill_s)}


def warmed(filt: PrefillOffloadFilter, n: int = MIN_SEEN) -> PrefillOffloadFilter:
    """`n` prompts of the usual size seen: each one stays where the scores send it."""
    for _ in range(n):
        cycle = request(usual())
        assert filt.filter(cycle, POOL) == POOL
        filt.dispatched(cycle, Decision(POOL[0], "cost", "test"))
    return filt


def test_the_filter_learns_nothing_by_itself() -> None:
    filt = PrefillOffloadFilter()
    for _ in range(2 * MIN_SEEN):
        filt.filter(request(usual()), POOL)
    assert not filt.is_long("m", 1.0)  # no size seen: nothing is long yet


def ids(candidates: list[Candidate]) -> list[str]:
    return [c.id for c in candidates]


def test_a_prompt_over_twice_the_recent_median_goes_to_the_slower_backends() -> None:
    filt = warmed(PrefillOffloadFilter())
    assert ids(filt.filter(request(usual(0.02)), POOL)) == ["l1", "l2"]


def test_a_prompt_under_twice_the_recent_median_stays_with_every_candidate() -> None:
    filt = warmed(PrefillOffloadFilter())
    assert filt.filter(request(usual(0.019)), POOL) == POOL


def test_nothing_is_long_before_enough_prompts_are_seen() -> None:
    filt = warmed(PrefillOffloadFilter(), MIN_SEEN - 1)
    assert filt.filter(request(usual(0.5)), POOL) == POOL


def test_a_workload_of_one_size_is_left_alone() -> None:
    # Every question the same size, however long: none is long against the others.
    filt = warmed(PrefillOffloadFilter())
    for _ in range(10):
        assert filt.filter(request(usual()), POOL) == POOL
        filt.dispatched(request(usual()), Decision(POOL[0], "cost", "test"))


def test_a_prompt_whose_history_a_backend_holds_is_not_long() -> None:
    # Its prefill where it costs least is the measure: a cached conversation costs little.
    filt = warmed(PrefillOffloadFilter())
    cached = usual(0.1)
    cached["h1"] = pred(idle=FAST, prefill_s=0.005)
    assert filt.filter(request(cached), POOL) == POOL


def test_only_slower_backends_that_start_it_within_the_budget_take_it() -> None:
    filt = warmed(PrefillOffloadFilter(params=OffloadParams(ttft_budget_s=0.3)))
    long = usual(0.05)
    long["l1"] = pred(idle=SLOW, prefill_s=0.15, ttft_s=0.31)
    assert ids(filt.filter(request(long), POOL)) == ["l2"]


def test_a_slower_backend_it_would_push_past_the_tpot_target_does_not_take_it() -> None:
    filt = warmed(PrefillOffloadFilter(SloTargets(tpot_s=0.05)))
    long = usual(0.05)
    long["l1"] = pred(idle=SLOW, prefill_s=0.15, others_s=0.051)  # its replies'
    long["l2"] = pred(idle=SLOW, prefill_s=0.15, tpot_s=0.051)  # its own
    assert filt.filter(request(long), POOL) == POOL


def test_on_a_fleet_of_one_speed_nothing_is_offloaded() -> None:
    filt = warmed(PrefillOffloadFilter())
    long = {c.id: pred(idle=FAST * (1.0 + 0.1 * i), prefill_s=0.05)
            for i, c in enumerate(POOL)}  # within 1.5x of the fastest: one speed
    assert filt.filter(request(long), POOL) == POOL


def test_recent_sizes_keep_the_median_of_the_last_window() -> None:
    sizes = RecentSizes(window=3)
    for value in (5.0, 1.0, 9.0, 7.0):  # 5.0 falls out
        sizes.add(value)
    assert len(sizes) == 3 and sizes.median() == 7.0


@pytest.mark.parametrize("bad", [{"ratio": 0.0}, {"ttft_budget_s": -1.0}, {"window": 0},
                                 {"slower_factor": 0.0}])
def test_bad_parameters_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        OffloadParams(**bad)  # type: ignore[arg-type]
