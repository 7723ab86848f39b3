"""The Fleet and its ledger, as rules: health, freshness, models, leases, effective free KV; and
freshness as the policies read it (a stale backend is preferred less, never excluded)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from routing.dispatch import Dispatch, Dispatcher, Job
from routing.fleet import Fleet, OutlierRules, effective_free_blocks
from routing.policies import PolicyContext, build_router
from routing.state import BackendSnapshot, BackendSpec, Candidate

MAX_AGE = 1.0
BASE = 30.0
ADMIN_FIELDS = {  # the fields GET /admin/backends promises
    "id", "url", "models", "format", "healthy", "kv_total_blocks", "kv_free_blocks", "kv_usage",
    "block_size", "running", "waiting", "inflight", "reserved_blocks", "last_poll_age_ms",
    "stale", "reachable", "consecutive_failures", "ejected_until", "ejections", "held_for_s",
}


def spec(backend_id: str, models: tuple[str, ...] = ("m",)) -> BackendSpec:
    return BackendSpec(id=backend_id, url=f"http://127.0.0.1:1/{backend_id}", models=models)


def snapshot(taken_at: float, free: int = 600, total: int = 1000, **kw: object) -> BackendSnapshot:
    fields: dict[str, object] = dict(
        format="vllm", kv_total_blocks=total, kv_free_blocks=free, kv_usage=1 - free / total,
        block_size=16, running=3, waiting=0,
    )
    fields.update(kw)
    return BackendSnapshot(taken_at=taken_at, **fields)  # type: ignore[arg-type]


def fleet(*ids: str, threshold: int = 3, fraction: float = 1.0) -> Fleet:
    rules = OutlierRules(consecutive_failures=threshold, base_ejection_s=BASE,
                         max_ejected_fraction=fraction)
    return Fleet([spec(i) for i in ids or ("a",)], max_snapshot_age=MAX_AGE, rules=rules)


def only(f: Fleet, now: float, backend_id: str = "a") -> Candidate:
    return f.candidate(backend_id, now)


def ids(f: Fleet, now: float, model: str = "m") -> list[str]:
    return [c.id for c in f.candidates(model, now)]


def fail(f: Fleet, backend_id: str, times: int, now: float = 1.0) -> None:
    for _ in range(times):
        f.record_request_failure(backend_id, now, "status_5xx")


# Health: reachability.


def test_a_backend_nothing_has_reached_is_out_of_rotation_until_a_scrape_reaches_it() -> None:
    f = fleet()
    assert not f.is_healthy("a", 0.0) and f.candidates("m", 0.0) == []
    f.record_scrape("a", snapshot(0.0))
    assert f.is_healthy("a", 0.0) and ids(f, 0.0) == ["a"]


@pytest.mark.parametrize("reach", [
    pytest.param(lambda f: f.record_success("a", 0.0), id="model discovery answered"),
    pytest.param(lambda f: f.record_scrape_failure("a", 0.0, answered=True),
                 id="a scrape answered 404 or garbage"),
    pytest.param(lambda f: f.record_request_success("a", 0.0), id="a request answered"),
])
def test_a_backend_never_scraped_successfully_but_answering_is_in_rotation_stale(
    reach: Callable[[Fleet], None],
) -> None:
    f = fleet()
    reach(f)
    assert ids(f, 0.0) == ["a"] and only(f, 0.0).stale


def test_a_scrape_that_got_no_answer_neither_reaches_nor_takes_a_backend_out() -> None:
    f = fleet("a", "b")
    f.record_success("a", 0.0)
    for _ in range(10):
        f.record_scrape_failure("a", 1.0, answered=False)
        f.record_scrape_failure("b", 1.0, answered=False)
    assert ids(f, 1.0) == ["a"] and f.scrape_failures("a") == 10


def test_a_refused_connection_takes_a_backend_out_until_a_scrape_reaches_it_again() -> None:
    f = fleet("a", "b")
    for i in ("a", "b"):
        f.record_scrape(i, snapshot(0.0))
    f.record_unreachable("a", 1.0)
    assert ids(f, 1.0) == ["b"] and not f.is_healthy("a", 1.0)
    f.record_scrape("a", snapshot(2.0))
    assert ids(f, 2.0) == ["a", "b"]


# Health: ejection by requests' outcomes.


@pytest.mark.parametrize("threshold", [1, 3, 5])
def test_k_request_failures_in_a_row_eject_a_backend_for_the_base_time(threshold: int) -> None:
    f = fleet("a", "b", threshold=threshold)
    for i in ("a", "b"):
        f.record_scrape(i, snapshot(0.0))
    fail(f, "a", threshold - 1)
    assert ids(f, 1.0) == ["a", "b"], f"ejected after {threshold - 1} of {threshold}"
    fail(f, "a", 1)
    assert ids(f, 1.0) == ["b"] and f.consecutive_failures("a") == threshold
    assert ids(f, 1.0 + BASE - 0.1) == ["b"] and ids(f, 1.0 + BASE) == ["a", "b"]
    assert f.ejection_counts() == {("a", "status_5xx"): 1}


def test_a_request_success_between_failures_resets_the_count() -> None:
    f = fleet("a", "b", threshold=2)
    f.record_scrape("a", snapshot(0.0))
    fail(f, "a", 1)
    f.record_request_success("a", 2.0)
    fail(f, "a", 1)
    assert f.is_healthy("a", 2.0) and f.consecutive_failures("a") == 1


@pytest.mark.parametrize("report", [
    pytest.param(lambda f: f.record_scrape("a", snapshot(1.5)), id="a good scrape"),
    pytest.param(lambda f: f.record_success("a", 1.5), id="model discovery"),
])
def test_what_is_not_a_request_neither_resets_the_failures_nor_ends_an_ejection(
    report: Callable[[Fleet], None],
) -> None:
    f = fleet("a", "b", threshold=3)
    for i in ("a", "b"):
        f.record_scrape(i, snapshot(0.0))
    fail(f, "a", 2)
    report(f)
    fail(f, "a", 1)
    assert ids(f, 1.5) == ["b"]
    report(f)
    assert ids(f, 1.5) == ["b"] and f.consecutive_failures("a") == 3


def test_an_ejection_beyond_the_cap_is_not_made_and_is_counted() -> None:
    f = fleet("a", "b", threshold=1, fraction=0.5)
    for i in ("a", "b"):
        f.record_scrape(i, snapshot(0.0))
    fail(f, "a", 1)
    fail(f, "b", 1)
    assert ids(f, 1.0) == ["b"]
    assert f.capped_counts() == {"b": 1} and f.ejection_counts() == {("a", "status_5xx"): 1}


def test_the_cap_counts_per_model_and_never_counts_unreachable_backends() -> None:
    f = Fleet([spec("a", ("m", "n")), spec("b", ("m",)), spec("c", ("n",)), spec("d", ("n",))],
              rules=OutlierRules(consecutive_failures=1, max_ejected_fraction=0.5))
    for i in "abcd":
        f.record_scrape(i, snapshot(0.0))
    f.record_unreachable("d", 0.5)
    fail(f, "c", 1)  # n: one of c, a ejected
    fail(f, "a", 1)  # m would allow it; n would have two of two reachable ejected
    assert ids(f, 1.0, "m") == ["a", "b"] and ids(f, 1.0, "n") == ["a"]
    assert f.capped_counts() == {"a": 1}


def test_after_an_ejection_one_failure_ejects_again_for_longer_and_a_success_forgives() -> None:
    f = fleet("a", "b", threshold=3)
    for i in ("a", "b"):
        f.record_scrape(i, snapshot(0.0))
    fail(f, "a", 3, now=0.0)
    assert f.health("a").ejected_until == BASE
    fail(f, "a", 1, now=BASE)
    assert f.health("a").ejected_until == 3 * BASE and f.health("a").ejections == 2
    f.record_request_success("a", 3 * BASE)
    fail(f, "a", 2, now=3 * BASE)
    assert f.is_healthy("a", 3 * BASE)


def test_a_hold_off_takes_a_backend_out_for_its_time_without_ejecting_it() -> None:
    f = fleet("a", "b")
    f.record_scrape("a", snapshot(0.0))
    f.record_scrape("b", snapshot(0.0))
    f.hold_off("a", until=7.0)
    assert ids(f, 0.5) == ["b"]
    assert f.is_healthy("a", 0.5) and f.health("a").ejections == 0
    assert ids(f, 7.0) == ["a", "b"]


def test_a_later_hold_off_never_shortens_an_earlier_one() -> None:
    f = fleet("a")
    f.hold_off("a", until=9.0)
    f.hold_off("a", until=3.0)
    assert f.held_until("a") == 9.0


def test_a_request_failure_names_a_known_reason() -> None:
    f = fleet("a")
    with pytest.raises(ValueError, match="unknown failure reason"):
        f.record_request_failure("a", 0.0, "status_4xx")


@pytest.mark.parametrize(("events", "expected"), [
    pytest.param([], None, id="nothing will bring an unreachable backend back by itself"),
    pytest.param([("scrape", "a")], 0.0, id="one available now"),
    pytest.param([("scrape", "a"), ("hold", "a", 4.0)], 3.0, id="the end of a hold-off"),
    pytest.param([("scrape", "a"), ("scrape", "b"), ("hold", "a", 12.0), ("eject", "b")], 8.0,
                 id="the first of a hold-off and an ejection to end"),
])
def test_back_in_is_the_time_until_the_first_of_a_models_backends_is_available(
    events: list[tuple[Any, ...]], expected: float | None,
) -> None:
    f = fleet("a", "b", threshold=1)
    for event in events:
        if event[0] == "scrape":
            f.record_scrape(event[1], snapshot(0.0))
        elif event[0] == "hold":
            f.hold_off(event[1], until=event[2])
        else:
            f.record_request_failure(event[1], 1.0 - BASE + 8.0, "timeout")
    assert f.back_in("m", 1.0) == expected


def test_an_older_scrape_never_replaces_a_newer_snapshot() -> None:
    f = fleet()
    f.record_scrape("a", snapshot(5.0, free=100))
    f.record_scrape("a", snapshot(4.0, free=900))
    assert f.snapshot("a") == snapshot(5.0, free=100)


# Models.


def test_models_come_from_discovery_then_configuration_then_the_metrics() -> None:
    f = Fleet([spec("conf", ("cfg",)), spec("disc", ()), spec("scraped", ()), spec("none", ())])
    f.set_models("disc", ("found",))
    f.record_scrape("scraped", snapshot(0.0, models=("from-labels", "lora-1")))
    assert [f.models_of(i) for i in ("conf", "disc", "scraped", "none")] == [
        ("cfg",), ("found",), ("from-labels", "lora-1"), ()
    ]


def test_healthy_models_is_the_sorted_union_over_healthy_backends_only() -> None:
    f = Fleet([spec("a", ("z", "x")), spec("b", ("y", "x")), spec("down", ("w",))])
    f.record_success("a", 0.0)
    f.record_success("b", 0.0)
    assert f.healthy_models(0.0) == ["x", "y", "z"]


def test_candidates_serve_the_model_asked_for_or_any_when_none() -> None:
    f = Fleet([spec("a", ("m1",)), spec("b", ("m2",))])
    for i in ("a", "b"):
        f.record_success(i, 0.0)
    assert [c.id for c in f.candidates("m2", 0.0)] == ["b"]
    assert [c.id for c in f.candidates(None, 0.0)] == ["a", "b"]
    assert f.candidates("unknown", 0.0) == []


# Freshness.


@pytest.mark.parametrize(
    ("age", "stale"),
    [(0.0, False), (MAX_AGE, False), (MAX_AGE + 0.001, True)],
    ids=["just taken", "exactly the maximum age", "older than the maximum age"],
)
def test_a_snapshot_older_than_the_maximum_age_is_stale(age: float, stale: bool) -> None:
    f = fleet()
    f.record_scrape("a", snapshot(10.0))
    assert only(f, 10.0 + age).stale is stale


def test_a_backend_without_a_snapshot_is_stale() -> None:
    f = fleet()
    f.record_success("a", 0.0)
    assert only(f, 0.0).stale


# The ledger and effective free KV.


def test_a_request_dispatched_after_the_scrape_reduces_effective_free_blocks() -> None:
    f = fleet()
    f.record_scrape("a", snapshot(10.0, free=600))
    with f.lease("a", 40, 10.2):
        c = only(f, 10.3)
        assert (c.dispatched_since_scrape, c.blocks_since_scrape) == (1, 40)
        assert effective_free_blocks(c) == 560
    assert effective_free_blocks(only(f, 10.4)) == 600


def test_a_request_dispatched_before_the_scrape_is_not_counted_twice() -> None:
    f = fleet()
    with f.lease("a", 40, 9.0):
        f.record_scrape("a", snapshot(10.0, free=600))  # the backend already holds its blocks
        c = only(f, 10.1)
        assert (c.inflight, c.reserved_blocks) == (1, 40)
        assert (c.dispatched_since_scrape, c.blocks_since_scrape) == (0, 0)
        assert effective_free_blocks(c) == 600


def test_fifty_requests_between_two_scrapes_do_not_all_land_on_the_emptiest_backend() -> None:
    f = fleet("a", "b")
    f.record_scrape("a", snapshot(10.0, free=600))
    f.record_scrape("b", snapshot(10.0, free=560))
    chosen = []
    leases = []
    for i in range(50):
        now = 10.01 + i * 0.001
        best = max(f.candidates("m", now), key=lambda c: effective_free_blocks(c) or 0)
        chosen.append(best.id)
        lease = f.lease(best.id, 20, now)
        leases.append(lease.acquire())
    assert 20 <= chosen.count("b") <= 30, chosen  # without the ledger: 50 on "a"
    for lease in leases:
        lease.release()
    assert [(c.inflight, c.reserved_blocks) for c in f.candidates("m", 11.0)] == [(0, 0), (0, 0)]


def test_a_stale_snapshot_is_never_read_as_idle() -> None:
    f = fleet()
    f.record_scrape("a", snapshot(10.0, free=100, total=1000))
    c = only(f, 10.0 + 5 * MAX_AGE)
    assert c.stale
    assert effective_free_blocks(c) == 100  # its last reading, not the 1000 of an empty backend


def test_a_stale_snapshot_is_further_bounded_by_the_ledger() -> None:
    f = fleet()
    with f.lease("a", 700, 5.0):  # dispatched before the scrape, still growing
        f.record_scrape("a", snapshot(10.0, free=600, total=1000))
        assert effective_free_blocks(only(f, 10.5)) == 600  # fresh: the scrape is trusted
        assert effective_free_blocks(only(f, 20.0)) == 300  # stale: capacity minus reservations


def test_without_a_snapshot_effective_free_blocks_are_unknown_not_all() -> None:
    f = fleet()
    f.record_success("a", 0.0)
    assert effective_free_blocks(only(f, 0.0)) is None
    f.record_scrape("a", BackendSnapshot(taken_at=0.0, format="tgi", running=2, waiting=0))
    assert effective_free_blocks(only(f, 0.0)) is None


def test_with_no_snapshot_every_inflight_request_counts_as_unseen() -> None:
    f = fleet()
    with f.lease("a", 7, 1.0), f.lease("a", 5, 2.0):
        c = only(f, 3.0)
        assert (c.inflight, c.reserved_blocks) == (2, 12)
        assert (c.dispatched_since_scrape, c.blocks_since_scrape) == (2, 12)


def test_effective_free_blocks_never_go_negative() -> None:
    f = fleet()
    f.record_scrape("a", snapshot(10.0, free=30))
    with f.lease("a", 50, 10.1):
        assert effective_free_blocks(only(f, 10.2)) == 0


# Leases.


def test_lease_releases_on_exception() -> None:
    f = fleet()
    with pytest.raises(RuntimeError, match="upstream died"), f.lease("a", 9, 1.0):
        assert (only(f, 1.0).inflight, only(f, 1.0).reserved_blocks) == (1, 9)
        raise RuntimeError("upstream died")
    assert (only(f, 2.0).inflight, only(f, 2.0).reserved_blocks) == (0, 0)


async def test_async_lease_releases_on_exception() -> None:
    f = fleet()
    with pytest.raises(ValueError, match="client went away"):
        async with f.lease("a", 9, 1.0):
            assert only(f, 1.0).inflight == 1
            raise ValueError("client went away")
    assert (only(f, 2.0).inflight, only(f, 2.0).reserved_blocks) == (0, 0)


def test_lease_releases_exactly_once() -> None:
    f = fleet()
    other = f.lease("a", 3, 0.5).acquire()
    with f.lease("a", 9, 1.0) as lease:
        lease.release()
        lease.release()
        assert (only(f, 1.0).inflight, only(f, 1.0).reserved_blocks) == (1, 3)
    assert (only(f, 1.0).inflight, only(f, 1.0).reserved_blocks) == (1, 3)
    other.release()


def test_a_lease_is_entered_once() -> None:
    f = fleet()
    lease = f.lease("a", 1, 0.0)
    with lease, pytest.raises(RuntimeError, match="entered once"):
        lease.acquire()
    with pytest.raises(RuntimeError, match="entered once"):
        lease.acquire()


def test_a_lease_counts_nothing_until_entered() -> None:
    f = fleet()
    f.lease("a", 50, 0.0)
    assert (only(f, 0.0).inflight, only(f, 0.0).reserved_blocks) == (0, 0)


def test_set_blocks_adjusts_the_reservation_at_any_point_before_release() -> None:
    f = fleet()
    f.record_scrape("a", snapshot(0.0, free=600))
    lease = f.lease("a", 10, 1.0)
    lease.set_blocks(12)  # before dispatch: the reservation it will start with
    with lease:
        assert only(f, 1.0).reserved_blocks == 12
        lease.set_blocks(30)  # e.g. at the first token, with the real prompt usage
        c = only(f, 1.0)
        assert (c.reserved_blocks, c.blocks_since_scrape, effective_free_blocks(c)) == (30, 30, 570)
    lease.set_blocks(99)  # after release: nothing to adjust
    assert only(f, 2.0).reserved_blocks == 0


def test_a_negative_reservation_is_refused() -> None:
    f = fleet()
    with pytest.raises(ValueError):
        f.lease("a", -1, 0.0)
    with f.lease("a", 1, 0.0) as lease, pytest.raises(ValueError):
        lease.set_blocks(-5)


# Admin rows.


def test_admin_rows_have_every_design_field_and_null_where_unknown() -> None:
    f = Fleet([BackendSpec(id="b0", url="http://127.0.0.1:8001", metrics_format="tgi")])
    (row,) = f.admin_rows(5.0)
    assert ADMIN_FIELDS <= set(row)
    assert row["id"] == "b0" and row["url"] == "http://127.0.0.1:8001"
    assert row["format"] == "tgi" and row["healthy"] is False and row["models"] == []
    for name in ("kv_total_blocks", "kv_free_blocks", "kv_usage", "block_size", "running",
                 "waiting", "last_poll_age_ms"):
        assert row[name] is None, name
    assert (row["inflight"], row["reserved_blocks"]) == (0, 0)
    json.dumps(row)  # serialisable as it stands


def test_admin_rows_report_the_snapshot_the_ledger_and_the_poll_age() -> None:
    f = Fleet([BackendSpec(id="b0", url="http://127.0.0.1:8001", models=("llama-3-8b",))])
    snap = snapshot(10.0, free=1204, total=2810)._replace(running=37, waiting=2)
    f.record_scrape("b0", snap)
    with f.lease("b0", 310, 9.0):
        (row,) = f.admin_rows(10.084)
    assert {k: row[k] for k in ADMIN_FIELDS} == {
        "id": "b0", "url": "http://127.0.0.1:8001", "models": ["llama-3-8b"], "format": "vllm",
        "healthy": True, "kv_total_blocks": 2810, "kv_free_blocks": 1204,
        "kv_usage": snap.kv_usage, "block_size": 16, "running": 37, "waiting": 2, "inflight": 1,
        "reserved_blocks": 310, "last_poll_age_ms": 84.0, "stale": False, "reachable": True,
        "consecutive_failures": 0, "ejected_until": None, "ejections": 0, "held_for_s": None,
    }
    assert row["effective_free_blocks"] == 1204 and row["scrape_failures"] == 0


def test_admin_rows_report_an_ejection_and_a_hold_off_in_seconds_from_now() -> None:
    f = fleet("a", "b", threshold=2)
    for i in ("a", "b"):
        f.record_scrape(i, snapshot(0.0))
    fail(f, "a", 2, now=1.0)
    f.hold_off("b", until=5.0)
    f.record_scrape_failure("b", 1.0, answered=True)
    a, b = f.admin_rows(2.0)
    assert (a["healthy"], a["ejected_until"], a["ejections"], a["consecutive_failures"]) == (
        False, BASE - 1.0, 1, 2)
    assert (b["healthy"], b["held_for_s"], b["ejected_until"], b["scrape_failures"]) == (
        True, 3.0, None, 1)


def test_backend_ids_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        Fleet([spec("a"), spec("a")])


# Freshness only affects routing quality.


def routed(f: Fleet, policy: str, now: float) -> set[str]:
    """Where one request goes, under eight seeds (a tie would be broken at random)."""
    chosen: set[str] = set()
    for seed in range(8):
        d = Dispatcher(f, build_router(policy, PolicyContext(rng=random.Random(seed))))
        out = d.submit(Job("r", "m", "hello there", max_tokens=8), now)
        assert isinstance(out, Dispatch), out
        chosen.add(out.backend_id)
        d.finish(out, now)
    return chosen


@pytest.mark.parametrize("policy", ["cost", "kv_util"])
@pytest.mark.parametrize("blind", [
    pytest.param(lambda f: f.record_success("blind", 0.0), id="never scraped"),
    pytest.param(lambda f: f.record_scrape("blind", snapshot(0.0, free=1000, running=0)),
                 id="last scraped idle, long ago"),
])
def test_a_stale_backend_is_preferred_less_than_a_fresh_one_but_stays_a_candidate(
    policy: str, blind: Callable[[Fleet], None],
) -> None:
    f = fleet("fresh", "blind")
    blind(f)
    f.record_scrape("fresh", snapshot(100.0, free=1000, running=0))
    assert routed(f, policy, 100.0) == {"fresh"}, "at equal load, the fresh one"
    f.record_scrape("fresh", snapshot(100.0, free=150, running=60, waiting=20))
    assert routed(f, policy, 100.0) == {"blind"}, "the stale one, once the fresh one is loaded"
