"""Admission control: the admit / queue / reject decision and the gateway queue's order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.admission import (
    RETRY_AFTER_MAX_S,
    RETRY_AFTER_MIN_S,
    RETRY_AFTER_UNKNOWN_S,
    AdmissionQueue,
    DrainRate,
    Verdict,
    admit,
    retry_after_s,
    timed_out,
)

E = TypeVar("E", bound=Hashable)


def drain(queue: AdmissionQueue[E]) -> list[E]:
    out: list[E] = []
    while (entry := queue.pop_next()) is not None:
        out.append(entry)
    return out


def filled(pushes: list[tuple[str, int, str]], max_depth: int = 100) -> AdmissionQueue[str]:
    queue: AdmissionQueue[str] = AdmissionQueue(max_depth)
    for t, (entry, priority, tenant) in enumerate(pushes):
        assert queue.push(entry, priority=priority, tenant=tenant, now=float(t))
    return queue


def test_higher_priority_class_leaves_the_queue_first() -> None:
    queue = filled([("low1", 0, "a"), ("high1", 2, "a"), ("mid1", 1, "b"), ("high2", 2, "b"),
                    ("low2", 0, "b")])
    order = drain(queue)
    assert order[:2] in (["high1", "high2"], ["high2", "high1"])
    assert order[2:] == ["mid1", "low1", "low2"] or order[2:] == ["mid1", "low2", "low1"]


def test_tenants_alternate_within_a_class() -> None:
    queue = filled([("a1", 0, "a"), ("a2", 0, "a"), ("a3", 0, "a"), ("b1", 0, "b"),
                    ("c1", 0, "c"), ("b2", 0, "b")])
    assert drain(queue) == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_each_tenant_is_served_first_in_first_out() -> None:
    queue = filled([(f"a{i}", 0, "a") for i in range(5)])
    assert drain(queue) == [f"a{i}" for i in range(5)]


def test_a_flooding_tenant_gets_no_more_than_its_turn() -> None:
    queue = filled([(f"flood{i}", 0, "flood") for i in range(50)] + [("polite", 0, "polite")])
    assert drain(queue).index("polite") <= 1


def test_peek_shows_what_pop_would_take_without_taking_it() -> None:
    queue = filled([("a1", 0, "a"), ("b1", 1, "b")])
    assert queue.peek_next() == "b1" and len(queue) == 2
    assert queue.pop_next() == "b1"
    assert AdmissionQueue[str](1).peek_next() is None


@pytest.mark.parametrize(
    ("max_depth", "max_per_tenant", "pushes", "accepted"),
    [
        (2, None, ["a", "a", "b"], [True, True, False]),
        (5, 2, ["a", "a", "a", "b"], [True, True, False, True]),
        (0, None, ["a"], [False]),
    ],
    ids=["queue-full", "tenant-share-full", "no-queue-at-all"],
)
def test_a_full_queue_or_tenant_share_refuses_a_push_and_changes_nothing(
    max_depth: int, max_per_tenant: int | None, pushes: list[str], accepted: list[bool]
) -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(max_depth, max_per_tenant=max_per_tenant)
    results = [queue.push(f"r{i}", priority=0, tenant=t, now=0.0) for i, t in enumerate(pushes)]
    assert results == accepted
    assert len(queue) == sum(accepted)


def test_pushing_an_entry_twice_is_an_error() -> None:
    queue = filled([("r1", 0, "a")])
    with pytest.raises(ValueError, match="already queued"):
        queue.push("r1", priority=1, tenant="b", now=5.0)


def test_a_disconnected_client_is_removed_and_its_tenant_keeps_its_turn() -> None:
    queue = filled([("a1", 0, "a"), ("b1", 0, "b"), ("a2", 0, "a"), ("c1", 0, "c")])
    assert queue.remove("a1") is True
    assert queue.remove("a1") is False
    assert "a1" not in queue
    assert queue.remove("c1") is True  # a tenant's last entry: the tenant leaves the rotation
    assert drain(queue) == ["a2", "b1"]


def test_expired_takes_out_every_entry_that_waited_past_the_timeout_oldest_first() -> None:
    queue = filled([("r0", 1, "a"), ("r1", 0, "b"), ("r2", 5, "a"), ("r3", 0, "a")])
    # Enqueued at t = 0, 1, 2, 3; at t = 12 with a 10 s timeout, r0 and r1 waited 12 and 11 s.
    assert queue.expired(12.0, 10.0) == ["r0", "r1"]
    assert queue.expired(12.0, 10.0) == []
    assert queue.oldest_wait(12.0) == 10.0  # r2, exactly at the timeout, stays
    assert drain(queue) == ["r2", "r3"]


def test_oldest_wait_and_depths_describe_the_queue() -> None:
    queue = filled([("r0", 0, "a"), ("r1", 2, "b"), ("r2", 1, "a")])
    assert queue.oldest_wait(10.0) == 10.0
    assert [queue.depth_at_or_above(p) for p in (3, 2, 1, 0)] == [0, 1, 2, 3]
    assert (queue.depth, queue.tenant_depth("a"), queue.tenant_depth("zz")) == (3, 2, 0)
    assert AdmissionQueue[str](1).oldest_wait(10.0) == 0.0


def test_a_clock_reading_that_goes_back_keeps_arrival_order() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(10)
    queue.push("first", priority=0, tenant="a", now=5.0)
    queue.push("second", priority=0, tenant="a", now=4.0)  # counts as 5.0
    assert queue.expired(15.5, 10.0) == ["first", "second"]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 2), st.sampled_from("abc"), st.floats(0, 5)),
        st.tuples(st.just("pop"), st.just(0), st.just(""), st.just(0.0)),
        st.tuples(st.just("remove"), st.integers(0, 60), st.just(""), st.just(0.0)),
        st.tuples(st.just("expire"), st.just(0), st.just(""), st.floats(0, 20)),
    ),
    max_size=80,
)


@given(OPS, st.integers(1, 12), st.one_of(st.none(), st.integers(1, 6)))
@settings(max_examples=300, deadline=None)
def test_every_pushed_entry_leaves_exactly_once_in_priority_order(
    ops: list[tuple[str, int, str, float]], max_depth: int, max_per_tenant: int | None
) -> None:
    queue: AdmissionQueue[int] = AdmissionQueue(max_depth, max_per_tenant=max_per_tenant)
    now, next_id = 0.0, 0
    priority_of: dict[int, int] = {}
    accepted: list[int] = []
    left: list[int] = []
    for op, number, tenant, amount in ops:
        if op == "push":
            now += amount
            if queue.push(next_id, priority=number, tenant=tenant, now=now):
                accepted.append(next_id)
                priority_of[next_id] = number
            next_id += 1
        elif op == "pop":
            entry = queue.pop_next()
            if entry is not None:
                waiting = [priority_of[e] for e in accepted if e not in left and e != entry]
                assert all(priority_of[entry] >= p for p in waiting)  # never skips a higher class
                left.append(entry)
        elif op == "remove":
            if queue.remove(number):
                left.append(number)
        else:
            left.extend(queue.expired(now, amount))
        assert len(queue) == len(accepted) - len(left) <= max_depth
        assert queue.depth_at_or_above(0) == len(queue)
    left.extend(drain(queue))
    assert Counter(left) == Counter(accepted)  # nothing lost, nothing duplicated
    assert len(queue) == 0 and queue.peek_next() is None


@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from("ab")), max_size=40))
@settings(max_examples=200, deadline=None)
def test_each_tenant_leaves_in_its_own_arrival_order(pushes: list[tuple[int, str]]) -> None:
    queue = filled([(f"{i}", p, t) for i, (p, t) in enumerate(pushes)])
    order = [int(e) for e in drain(queue)]
    for cls in (0, 1):
        for tenant in "ab":
            mine = [i for i in order if pushes[i] == (cls, tenant)]
            assert mine == sorted(mine)


class Queue:
    """A queue state for `admit`, as a table row."""

    def __init__(self, depth: int = 0, max_depth: int = 10, ahead: int = 0,
                 tenant: int = 0, max_per_tenant: int | None = None) -> None:
        self.depth, self.max_depth, self._ahead = depth, max_depth, ahead
        self._tenant, self.max_per_tenant = tenant, max_per_tenant

    def tenant_depth(self, tenant: str) -> int:
        return self._tenant

    def depth_at_or_above(self, priority: int) -> int:
        return self._ahead


@pytest.mark.parametrize(
    ("any_fits", "all_oversized", "queue", "verdict", "status"),
    [
        (True, False, Queue(), Verdict.ADMIT, None),
        (False, False, Queue(), Verdict.QUEUE, None),
        (True, False, Queue(depth=3, ahead=3), Verdict.QUEUE, None),
        (True, False, Queue(depth=3, ahead=0), Verdict.ADMIT, None),
        (False, False, Queue(depth=10, ahead=10), Verdict.REJECT, 429),
        (True, False, Queue(depth=10, ahead=4), Verdict.REJECT, 429),
        (False, False, Queue(depth=5, tenant=2, max_per_tenant=2), Verdict.REJECT, 429),
        (False, True, Queue(depth=10, ahead=10), Verdict.ADMIT, None),
    ],
    ids=["fits-and-nobody-waits", "fleet-full-waits", "fits-but-queues-behind-waiting",
         "fits-and-only-lower-classes-wait", "full-queue-rejects-at-once",
         "full-queue-rejects-even-a-fitting-request-behind-others", "tenant-share-full-rejects",
         "too-big-for-any-backend-goes-to-the-backend"],
)
def test_admission_decision(
    any_fits: bool, all_oversized: bool, queue: Queue, verdict: Verdict, status: int | None
) -> None:
    decision = admit(any_fits=any_fits, all_oversized=all_oversized, priority=0, tenant="t",
                     queue=queue, drain_per_s=2.0)
    assert (decision.verdict, decision.status) == (verdict, status)
    assert (decision.retry_after_s is not None) == (verdict is Verdict.REJECT)


def test_a_full_queue_rejects_at_once_with_retry_after() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(4)
    for i in range(4):
        queue.push(f"r{i}", priority=0, tenant="a", now=0.0)
    decision = admit(any_fits=False, all_oversized=False, priority=0, tenant="b", queue=queue,
                     drain_per_s=0.5)
    assert (decision.verdict, decision.status, decision.retry_after_s) == (Verdict.REJECT, 429, 8)


def test_a_wait_past_the_timeout_answers_503_with_retry_after() -> None:
    decision = timed_out(ahead=6, drain_per_s=3.0)
    assert (decision.verdict, decision.status, decision.retry_after_s) == (Verdict.REJECT, 503, 2)


@pytest.mark.parametrize(
    ("ahead", "rate", "seconds"),
    [(10, 5.0, 2), (11, 5.0, 3), (0, 5.0, RETRY_AFTER_MIN_S), (1, 100.0, RETRY_AFTER_MIN_S),
     (10_000, 1.0, RETRY_AFTER_MAX_S), (5, None, RETRY_AFTER_UNKNOWN_S),
     (5, 0.0, RETRY_AFTER_UNKNOWN_S)],
    ids=["drains-in-2s", "rounds-up", "empty-queue-floor", "fast-floor", "slow-cap",
         "pace-unknown", "nothing-draining"],
)
def test_retry_after_is_the_time_for_the_queue_ahead_to_drain(
    ahead: int, rate: float | None, seconds: int
) -> None:
    assert retry_after_s(ahead, rate) == seconds


def test_drain_rate_measures_a_steady_pace_and_fades_when_idle() -> None:
    meter = DrainRate(tau_s=10.0)
    assert meter.per_second(0.0) is None
    t = 0.0
    while t < 200.0:
        meter.record(t)
        t += 0.25  # 4 per second
    assert meter.per_second(t) == pytest.approx(4.0, rel=0.05)
    assert meter.per_second(t + 100.0) == pytest.approx(0.0, abs=1e-3)
