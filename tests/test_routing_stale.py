"""A backend whose metrics are stale or missing but which answers requests: routed by the
gateway's ledger, preferred less than a fresh backend at equal load, never left idle beside a
busy one, and never read as emptier than what the gateway sent there."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from routing.dispatch import Dispatch, Dispatcher, Job
from routing.fleet import Fleet
from routing.policies import PolicyContext, build_router
from routing.predict import backend_load, lease_block_size, predict_on, request_terms
from routing.scheduling.ledger_view import (
    STALE_EXTRA_REQUESTS,
    ledger_candidate,
    ledger_load,
    peer_capacity_tokens,
    stale_kv_free,
    stale_queue_depth,
)
from routing.state import BackendSnapshot, BackendSpec, Candidate
from tests.test_routing_scorers import PROFILE, cost

BLOCK = 16
TOTAL = 1000  # blocks
MAX_AGE = 5.0
REQUEST_TOKENS = 1080.0  # cost(): a 1,000-token typical prompt and half a 160-token reply
EXTRA_BLOCKS = STALE_EXTRA_REQUESTS * 68  # ceil(1080 / 16) blocks per extra request
PROMPT = "word " * 2000  # about the cost model's typical prompt; each request's own


def spec(backend_id: str, *, budget: int | None = None) -> BackendSpec:
    return BackendSpec(backend_id, f"http://127.0.0.1/{backend_id}", ("m",),
                       max_batch_total_tokens=budget)


def snap(taken_at: float, *, total: int | None = TOTAL, free: int | None = TOTAL,
         running: int = 0, waiting: int = 0) -> BackendSnapshot:
    return BackendSnapshot(taken_at=taken_at, format="vllm", kv_total_blocks=total,
                           kv_free_blocks=free, block_size=BLOCK, running=running,
                           waiting=waiting)


def stale(backend_id: str = "blind", *, snapshot: BackendSnapshot | None = None,
          inflight: int = 0, reserved: int = 0, budget: int | None = None) -> Candidate:
    return Candidate(spec(backend_id, budget=budget), True, snapshot, True, inflight, reserved)


def fresh(backend_id: str = "fresh", total: int | None = TOTAL) -> Candidate:
    return Candidate(spec(backend_id), True, snap(0.0, total=total, free=total), False, 0, 0)


# Routing: where one more request goes, under each load-based policy.

NEVER_SCRAPED = pytest.param(lambda f: f.record_success("blind", 0.0), id="never scraped")
SCRAPED_LONG_AGO = pytest.param(lambda f: f.record_scrape("blind", snap(0.0)),
                                id="last scraped idle, long ago")


def place(f: Fleet, d: Dispatcher, backend: str, count: int, now: float) -> None:
    """`count` requests to `backend`, the other held off meanwhile; they stay in flight."""
    other = "blind" if backend == "fresh" else "fresh"
    f.hold_off(other, now + 0.1)
    for i in range(count):
        out = d.submit(Job(f"{backend}{i}", "m", f"{backend}{i} {PROMPT}", max_tokens=64), now)
        assert isinstance(out, Dispatch) and out.backend_id == backend, out


def routed(policy: str, blind: Callable[[Fleet], None], on_fresh: tuple[int, int],
           on_blind: int) -> set[str]:
    """Where one request goes, under eight seeds (a tie would be broken at random), once the
    gateway has requests in flight on each: `on_fresh` (running, waiting) as the fresh backend's
    next scrape shows them, `on_blind` on the stale one."""
    chosen: set[str] = set()
    for seed in range(8):
        f = Fleet([spec("fresh"), spec("blind")], max_snapshot_age=MAX_AGE)
        blind(f)
        f.record_scrape("fresh", snap(100.0))
        d = Dispatcher(f, build_router(policy, PolicyContext(rng=random.Random(seed))))
        running, waiting = on_fresh
        place(f, d, "fresh", running + waiting, 100.0)
        place(f, d, "blind", on_blind, 100.2)
        held = f.candidate("fresh", 100.9).reserved_blocks
        f.record_scrape("fresh", snap(100.9, free=TOTAL - held, running=running,
                                      waiting=waiting))
        assert f.candidate("blind", 101.0).stale and not f.candidate("fresh", 101.0).stale
        out = d.submit(Job("r", "m", f"r {PROMPT}", max_tokens=64), 101.0)
        assert isinstance(out, Dispatch), out
        chosen.add(out.backend_id)
    return chosen


@pytest.mark.parametrize("policy", ["cost", "kv_util", "least_request", "power_of_two"])
@pytest.mark.parametrize("blind", [NEVER_SCRAPED, SCRAPED_LONG_AGO])
@pytest.mark.parametrize(("on_fresh", "on_blind", "expected"), [
    pytest.param((2, 2), 0, "blind", id="an idle stale backend beats a busy fresh one"),
    pytest.param((2, 3), 1, "blind", id="a stale backend holding fewer beats a busier fresh one"),
    pytest.param((0, 0), 0, "fresh", id="both idle: the fresh one"),
    pytest.param((2, 0), 2, "fresh", id="two in flight on each: the fresh one"),
])
def test_a_stale_backend_is_routed_by_the_ledger_and_preferred_less_at_equal_load(
        policy: str, blind: Callable[[Fleet], None], on_fresh: tuple[int, int], on_blind: int,
        expected: str) -> None:
    assert routed(policy, blind, on_fresh, on_blind) == {expected}


# The ledger's reading: what a stale backend is taken to hold.

@pytest.mark.parametrize(("candidates", "expected"), [
    pytest.param([fresh("a", 3000), fresh("b", 1000), fresh("c", 2000)], 1000 * BLOCK,
                 id="the smallest capacity reported"),
    pytest.param([fresh("a", 3000), stale("s", snapshot=snap(0.0, total=500))], 500 * BLOCK,
                 id="a stale snapshot still says how large its backend is"),
    pytest.param([fresh("a", 3000), stale("s", budget=4000)], 4000,
                 id="a configured token budget counts"),
    pytest.param([fresh("a", None), stale("s")], None, id="no capacity reported: none"),
])
def test_the_peer_capacity_is_the_smallest_reported(
        candidates: list[Candidate], expected: int | None) -> None:
    assert peer_capacity_tokens(candidates) == expected


def test_a_stale_backend_is_taken_to_hold_the_ledgers_requests_plus_the_extra() -> None:
    assert stale_queue_depth(stale(inflight=3)) == 3 + STALE_EXTRA_REQUESTS


@pytest.mark.parametrize(("candidate", "typical", "expected"), [
    pytest.param(stale(snapshot=snap(0.0, free=TOTAL), reserved=600), None,
                 1.0 - (600 + EXTRA_BLOCKS) / TOTAL,
                 id="a reading that said idle: the ledger's reservations plus the extra"),
    pytest.param(stale(snapshot=snap(0.0, free=0), reserved=100), None,
                 1.0 - (100 + EXTRA_BLOCKS) / TOTAL,
                 id="a reading that said full is no longer evidence: the ledger"),
    pytest.param(stale(reserved=600), TOTAL * BLOCK, 1.0 - (600 + EXTRA_BLOCKS) / TOTAL,
                 id="never scraped: out of its smallest peer's capacity"),
    pytest.param(stale(reserved=990), TOTAL * BLOCK, 0.0,
                 id="reservations past the capacity: nothing free"),
    pytest.param(stale(reserved=600), None, None, id="no capacity to go by: unknown"),
])
def test_a_stale_backends_free_kv_is_bounded_by_the_ledger(
        candidate: Candidate, typical: int | None, expected: float | None) -> None:
    free = stale_kv_free(candidate, typical, REQUEST_TOKENS)
    assert free == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(("candidate", "typical", "capacity", "block_size"), [
    pytest.param(stale(snapshot=snap(0.0, total=500)), 2000 * BLOCK, 500, BLOCK,
                 id="its own capacity, when a snapshot ever gave one"),
    pytest.param(stale(), 2000 * BLOCK, 2000, BLOCK, id="else its smallest peer's"),
    pytest.param(stale(), None, None, BLOCK, id="else unknown"),
    pytest.param(stale(budget=50_000), 2000 * BLOCK, 50_000, 1,
                 id="a token budget from its configuration is kept"),
    pytest.param(stale(snapshot=snap(0.0, total=None, free=None), budget=50_000), 2000 * BLOCK,
                 50_000, 1, id="a token budget beside a snapshot without KV figures too"),
])
def test_the_ledgers_reading_is_on_its_own_capacity_else_the_fleets(
        candidate: Candidate, typical: int | None, capacity: int | None,
        block_size: int) -> None:
    view = ledger_candidate(candidate, typical, REQUEST_TOKENS)
    load = ledger_load(candidate, PROFILE, None, 0.0, 1000.0, 160.0, typical)
    assert (load.capacity, load.block_size) == (capacity, block_size)
    assert load.lease_block_size == lease_block_size(candidate)  # the ledger's own blocks
    assert view.stale and view.inflight == STALE_EXTRA_REQUESTS


@pytest.mark.parametrize(("reserved", "fits"), [
    pytest.param(0, True, id="idle by the ledger: the request fits"),
    pytest.param(800, False, id="filled by the ledger: over the high-water mark"),
])
def test_a_stale_backend_is_never_predicted_emptier_than_the_ledger(
        reserved: int, fits: bool) -> None:
    blind = stale(snapshot=snap(0.0, free=TOTAL), inflight=8, reserved=reserved)
    load = ledger_load(blind, PROFILE, None, 0.0, 1000.0, 160.0, None)
    prediction = predict_on(load, request_terms(cost(prompt=1600)), 0)
    assert load.used == reserved + EXTRA_BLOCKS
    assert prediction.free_blocks == TOTAL - reserved - EXTRA_BLOCKS
    assert prediction.fits is fits


def test_the_extra_requests_decode_there_they_queue_no_prompt_ahead() -> None:
    idle = ledger_load(stale(), PROFILE, None, 0.0, 1000.0, 160.0, TOTAL * BLOCK)
    alone = backend_load(stale(), PROFILE, None, 0.0, 1000.0, 160.0)
    assert idle.queued_tokens == alone.queued_tokens == 0.0
    assert (idle.running, alone.running) == (STALE_EXTRA_REQUESTS, 0)
    assert idle.step_s > alone.step_s and idle.used > alone.used
    assert idle.source == alone.source  # "no snapshot": the reason says what is known


@pytest.mark.parametrize(("age", "used"), [
    pytest.param(2.0, 900 + EXTRA_BLOCKS, id="a reading seconds old still bounds it from below"),
    pytest.param(60.0, 10 + EXTRA_BLOCKS, id="a reading a minute old says nothing any more"),
])
def test_a_recent_stale_reading_counts_beside_the_ledger(age: float, used: int) -> None:
    # 900 of 1,000 blocks were in use at the last reading (other gateways' requests among
    # them); this gateway's ledger holds 10 blocks there.
    blind = stale(snapshot=snap(0.0, free=TOTAL - 900), inflight=1, reserved=10)
    load = ledger_load(blind, PROFILE, None, age, 1000.0, 160.0, None)
    assert load.used == used
