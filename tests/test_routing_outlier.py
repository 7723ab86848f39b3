"""Passive outlier ejection as rules (routing/outlier.py), and what the Dispatcher answers when no
backend of a model is left: 503 `no_healthy_backend` at once, with the Retry-After the rules
give."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from routing import outlier
from routing.dispatch import NO_HEALTHY_BACKEND, Dispatcher, Job, Rejection, Waiting
from routing.fleet import Fleet
from routing.outlier import Event, Health, OutlierRules
from routing.policies import PolicyContext, build_router
from routing.state import BackendSnapshot, BackendSpec

RULES = OutlierRules(consecutive_failures=3, base_ejection_s=10.0, max_ejected_fraction=0.5)
UP = Health(reachable=True)


def failures(health: Health, times: int, now: float, *, cap: bool = True) -> tuple[Health, Event]:
    event = Event.COUNTED
    for _ in range(times):
        health, event = outlier.on_failure(health, now, "status_5xx", RULES, cap_allows=cap)
    return health, event


# Ejection and its length.


@pytest.mark.parametrize(("before", "times", "event", "until"), [
    pytest.param(UP, 2, Event.COUNTED, -math.inf, id="below the threshold: counted only"),
    pytest.param(UP, 3, Event.EJECTED, 110.0, id="the threshold ejects for the base time"),
    pytest.param(replace(UP, multiplier=1, ejections=1, ejected_until=95.0, failures=3), 1,
                 Event.EJECTED, 120.0,
                 id="back from one ejection five seconds ago: one failure, twice as long"),
    pytest.param(replace(UP, multiplier=3, ejections=3, ejected_until=75.0, failures=3), 1,
                 Event.EJECTED, 120.0,
                 id="25 s back in rotation take two off a multiplier of three: 2 x base"),
    pytest.param(replace(UP, multiplier=2, ejections=2, ejected_until=40.0, failures=0), 3,
                 Event.EJECTED, 110.0, id="a long healthy time decays it to zero"),
    pytest.param(replace(UP, multiplier=12, ejections=12, ejected_until=100.0, failures=3), 1,
                 Event.EJECTED, 200.0, id="never longer than max_ejection_factor times base"),
    pytest.param(replace(UP, multiplier=1, ejections=1, ejected_until=105.0, failures=3), 1,
                 Event.COUNTED, 105.0, id="a failure while ejected does not eject again"),
])
def test_failures_in_a_row_eject_for_base_times_the_decayed_multiplier(
    before: Health, times: int, event: Event, until: float,
) -> None:
    after, got = failures(before, times, 100.0)
    assert (got, after.ejected_until) == (event, until)
    assert after.failures == before.failures + times
    assert after.ejections == before.ejections + (got is Event.EJECTED)


def test_an_ejection_beyond_the_cap_is_not_made_and_the_next_failure_tries_again() -> None:
    capped, event = failures(UP, 3, 0.0, cap=False)
    assert event is Event.CAPPED and outlier.available(capped, 0.0)
    ejected, event = outlier.on_failure(capped, 1.0, "timeout", RULES, cap_allows=True)
    assert event is Event.EJECTED and not outlier.available(ejected, 1.0)


@pytest.mark.parametrize(("groups", "fraction", "allows"), [
    pytest.param([(0, 2)], 0.5, True, id="one of two"),
    pytest.param([(1, 2)], 0.5, False, id="two of two"),
    pytest.param([(0, 1)], 0.5, False, id="the only backend of a model, at one half"),
    pytest.param([(0, 1)], 1.0, True, id="the only backend, at a cap of one"),
    pytest.param([(1, 4)], 0.5, True, id="two of four"),
    pytest.param([(0, 4), (1, 2)], 0.5, False, id="every model the backend serves counts"),
    pytest.param([(0, 3)], 0.0, False, id="a cap of zero ejects nothing"),
])
def test_the_cap_on_a_models_ejected_share(
    groups: list[tuple[int, int]], fraction: float, allows: bool,
) -> None:
    assert outlier.cap_allows(groups, fraction) is allows


# What resets what.


@pytest.mark.parametrize(("step", "reset"), [
    pytest.param(outlier.on_success, True, id="a request's success resets the count"),
    pytest.param(outlier.on_reached, False, id="a good scrape or discovery does not"),
    pytest.param(lambda h: outlier.on_hold(h, 50.0), False, id="a hold-off does not"),
])
def test_only_a_requests_success_resets_the_failures_in_a_row(
    step: Callable[[Health], Health], reset: bool,
) -> None:
    counted, _ = failures(UP, 2, 0.0)
    assert step(counted).failures == (0 if reset else 2)


def test_a_good_scrape_never_ends_an_ejection() -> None:
    ejected, _ = failures(UP, 3, 0.0)
    assert not outlier.in_rotation(outlier.on_reached(ejected), 5.0)
    assert outlier.in_rotation(outlier.on_reached(ejected), 10.0)


def test_an_unreachable_backend_is_out_whatever_the_cap_until_reached_again() -> None:
    down = outlier.on_unreachable(UP)
    assert not outlier.in_rotation(down, 0.0) and down.ejections == 0
    assert outlier.in_rotation(outlier.on_reached(down), 0.0)


def test_a_5xx_is_an_answer_a_timeout_is_not() -> None:
    unknown = Health()
    assert outlier.on_failure(unknown, 0.0, "status_5xx", RULES, cap_allows=True)[0].reachable
    assert not outlier.on_failure(unknown, 0.0, "timeout", RULES, cap_allows=True)[0].reachable


def test_a_hold_off_stops_traffic_without_ejecting_and_is_never_shortened() -> None:
    held = outlier.on_hold(outlier.on_hold(UP, 9.0), 3.0)
    assert held.held_until == 9.0 and held.ejections == 0
    assert outlier.in_rotation(held, 1.0) and not outlier.available(held, 1.0)
    assert outlier.available(held, 9.0)


@pytest.mark.parametrize(("healths", "expected"), [
    pytest.param([UP], 0.0, id="one available now"),
    pytest.param([replace(UP, held_until=4.0), replace(UP, ejected_until=7.0)], 3.0,
                 id="the first hold or ejection to end"),
    pytest.param([replace(UP, held_until=9.0, ejected_until=5.0)], 8.0,
                 id="a backend both ejected and held is back when both have ended"),
    pytest.param([Health(), replace(UP, ejected_until=6.0)], 5.0,
                 id="unreachable backends have no time of their own"),
    pytest.param([Health(reachable=False)], None, id="nothing will end by itself"),
])
def test_back_in(healths: list[Health], expected: float | None) -> None:
    assert outlier.back_in(healths, 1.0) == expected


def test_a_reason_outside_the_known_failures_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown failure reason"):
        outlier.on_failure(UP, 0.0, "status_4xx", RULES, cap_allows=True)


# What the Dispatcher answers.


def dispatcher(*ids: str) -> tuple[Fleet, Dispatcher]:
    fleet = Fleet([BackendSpec(id=i, url=f"http://127.0.0.1:1/{i}", models=("m",)) for i in ids],
                  rules=OutlierRules(consecutive_failures=1, base_ejection_s=10.0,
                                     max_ejected_fraction=1.0))
    for i in ids:
        fleet.record_scrape(i, BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=100,
                                               kv_free_blocks=100, block_size=16, running=0,
                                               waiting=0))
    return fleet, Dispatcher(fleet, build_router("least_request", PolicyContext()))


def job(request_id: str = "r") -> Job:
    return Job(request_id, "m", "hello", max_tokens=8)


@pytest.mark.parametrize(("outage", "retry_after"), [
    pytest.param(lambda f: f.record_request_failure("a", 0.5, "status_5xx"), 10,
                 id="ejected for 10 s from 0.5, asked at 1.0: ceil(9.5)"),
    pytest.param(lambda f: f.hold_off("a", until=1.2), 1, id="a hold ending in 0.2 s: 1 s"),
    pytest.param(lambda f: f.record_unreachable("a", 0.5), 1, id="unreachable: 1 s"),
])
def test_no_backend_left_is_a_503_at_once_with_retry_after(
    outage: Callable[[Fleet], None], retry_after: int,
) -> None:
    fleet, d = dispatcher("a")
    outage(fleet)
    out = d.submit(job(), 1.0)
    assert isinstance(out, Rejection)
    assert (out.status, out.code, out.retry_after_s) == (503, NO_HEALTHY_BACKEND, retry_after)


def test_requests_queued_for_a_model_get_the_503_when_its_last_backend_goes() -> None:
    fleet, d = dispatcher("a")
    fleet.lease("a", 0, 0.0).acquire().release()  # a dispatch there, ended
    held = [d.submit(Job(f"r{i}", "m", "x" * 2000, max_tokens=400), 1.0) for i in range(40)]
    queued = [w for w in held if isinstance(w, Waiting)]
    assert queued, "the test needs requests in the queue"
    fleet.record_request_failure("a", 2.0, "timeout")
    pumped = d.pump(2.5)
    refused = [r for r in pumped.rejected if r.waiting in queued]
    assert len(refused) == len(queued) and d.queue_depth == 0
    assert {(r.code, r.retry_after_s) for r in refused} == {(NO_HEALTHY_BACKEND, 10)}
