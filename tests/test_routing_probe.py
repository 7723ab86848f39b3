"""Measuring a backend the gateway knows too little about (routing/scheduling/probe.py): while a
backend's speed rests on fewer than BOOTSTRAP_TPOTS replies, an idle one gets the next request
that can show its speed and that it would still serve soon; busy, measured or cold-start fleets
are left alone. The filter only reads; the probes sent are counted once dispatched."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from routing.jobs import WHOLE_ANSWER_MIN_TOKENS
from routing.policy import Router
from routing.scheduling.cycle import CycleState
from routing.scheduling.pickers import MaxScorePicker
from routing.scheduling.probe import ProbeParams, SpeedProbeFilter
from routing.state import BackendSpec, Candidate
from routing.ttft import BOOTSTRAP_TPOTS, Prediction
from tests.test_routing_offload import cost  # a request; its size does not matter here


def cand(backend_id: str, inflight: int = 0) -> Candidate:
    spec = BackendSpec(backend_id, f"http://127.0.0.1/{backend_id}", ("m",))
    return Candidate(spec, True, None, True, inflight, 0)


def pred(ttft_s: float = 0.05) -> Prediction:
    return Prediction(0.0, 0.01, 0.0, 0.0, ttft_s, 0.0, True, False, 100, 0, 0, "x")


def request(measured: Mapping[str, int], *, stream: bool = True, max_tokens: int | None = None,
            ttft_s: Mapping[str, float] | None = None) -> CycleState:
    ttft_s = ttft_s or {}
    predictions = {b: pred(ttft_s.get(b, 0.05)) for b in ("h1", "h2", "l1", "l2")}
    return CycleState("m", cost(), stream=stream, max_tokens=max_tokens,
                      predictions=predictions, measured=measured)


MAX_PROBES = ProbeParams().max_probes
MEASURED = {"h1": 40, "h2": 40, "l1": 3, "l2": 5}


def ids(candidates: list[Candidate]) -> list[str]:
    return [c.id for c in candidates]


def test_an_idle_under_measured_backend_gets_the_request() -> None:
    pool = [cand("h1", 3), cand("h2", 2), cand("l1"), cand("l2", 1)]
    assert ids(SpeedProbeFilter().filter(request(MEASURED), pool)) == ["l1"]


def test_the_backend_measured_least_is_probed_first() -> None:
    pool = [cand("h1"), cand("h2"), cand("l1"), cand("l2")]
    assert ids(SpeedProbeFilter().filter(request(MEASURED), pool)) == ["l1"]
    assert ids(SpeedProbeFilter().filter(request(MEASURED | {"l1": 6}), pool)) == ["l2"]


def test_a_backend_with_a_request_in_flight_is_not_probed() -> None:
    pool = [cand("h1"), cand("h2"), cand("l1", 1), cand("l2", 1)]
    assert SpeedProbeFilter().filter(request(MEASURED), pool) == pool


def test_a_backend_measured_enough_is_left_to_the_scores() -> None:
    pool = [cand("h1"), cand("h2"), cand("l1"), cand("l2")]
    enough = dict.fromkeys(("h1", "h2", "l1", "l2"), BOOTSTRAP_TPOTS)
    assert SpeedProbeFilter().filter(request(enough), pool) == pool


def test_at_a_cold_start_every_backend_is_left_to_the_scores() -> None:
    # Every backend idle and unmeasured: there is nothing to prefer.
    pool = [cand("h1"), cand("h2"), cand("l1"), cand("l2")]
    assert SpeedProbeFilter().filter(request({}), pool) == pool


def test_a_request_whose_first_token_would_come_late_there_is_not_a_probe() -> None:
    pool = [cand("h1"), cand("h2"), cand("l1"), cand("l2")]
    late = request(MEASURED, ttft_s={"l1": 0.5})
    assert ids(SpeedProbeFilter().filter(late, pool)) == ["l2"]
    both_late = request(MEASURED, ttft_s={"l1": 0.5, "l2": 0.31})
    assert SpeedProbeFilter().filter(both_late, pool) == pool


def test_a_whole_answer_too_short_to_show_the_speed_is_not_a_probe() -> None:
    pool = [cand("h1"), cand("h2"), cand("l1"), cand("l2")]
    short = request(MEASURED, stream=False, max_tokens=WHOLE_ANSWER_MIN_TOKENS - 1)
    assert SpeedProbeFilter().filter(short, pool) == pool
    for max_tokens in (None, WHOLE_ANSWER_MIN_TOKENS):  # may run long enough: its time teaches
        whole = request(MEASURED, stream=False, max_tokens=max_tokens)
        assert ids(SpeedProbeFilter().filter(whole, pool)) == ["l1"]


def test_a_backend_is_probed_at_most_max_probes_times() -> None:
    filt = SpeedProbeFilter()
    router = Router("t", picker=MaxScorePicker(random.Random(0)), filters=(filt,), hooks=(filt,))
    pool = [cand("h1"), cand("h2"), cand("l1")]
    measured = {"h1": 40, "h2": 40, "l1": 0}  # its streams never yield a TPOT
    for _ in range(MAX_PROBES):
        cycle = request(measured)
        decision = router.route(cycle, pool)
        assert decision.backend_id == "l1"
        router.dispatched(cycle, decision)
    assert filt.filter(request(measured), pool) == pool  # probed enough


def test_the_filter_counts_nothing_by_itself() -> None:
    filt = SpeedProbeFilter()
    pool = [cand("h1"), cand("h2"), cand("l1")]
    for _ in range(MAX_PROBES + 1):  # never dispatched: never counted, still a probe
        assert ids(filt.filter(request({"h1": 40, "h2": 40, "l1": 0}), pool)) == ["l1"]


@pytest.mark.parametrize("kwargs", [{"replies_needed": 0}, {"max_probes": 0},
                                    {"ttft_budget_s": 0.0}])
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ProbeParams(**kwargs)  # type: ignore[arg-type]
