"""Pooled KV holds: what a backend's in-flight requests are held to together, from the cost
model's estimates through the ledger, the lease and the Dispatcher's admission (pure, virtual
time)."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from routing.cost import CostModel
from routing.dispatch import Dispatch, DispatchConfig, Dispatcher, Job, Waiting
from routing.fleet import Fleet
from routing.kv_hold import Commitments, Hold, KVPool, exact, pooled
from routing.ledger import Lease, Ledger
from routing.policies import PolicyContext, build_router
from routing.state import BackendSnapshot, BackendSpec

BLOCK = 16
PROMPT = "hello " * 20


@pytest.mark.parametrize("quantile", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("max_tokens", [64, 256, 2048, None])
def test_one_request_alone_holds_exactly_its_own_reservation(
        quantile: float, max_tokens: int | None) -> None:
    cost = CostModel(reservation_quantile=quantile).estimate("m", PROMPT, max_tokens)
    ledger = Ledger()
    with Lease(ledger, cost.hold(BLOCK), 0.0) as lease:
        assert ledger.reserved_blocks == cost.reserve_blocks(BLOCK) == lease.blocks
        assert ledger.since(0.0) == (1, cost.reserve_blocks(BLOCK))
    assert ledger.reserved_blocks == 0


def test_identical_requests_pool_to_their_mean_plus_z_root_n_deviations() -> None:
    quantile = 0.9
    cost = CostModel(reservation_quantile=quantile).estimate("m", PROMPT, 2048)
    hold = cost.hold(BLOCK)
    z = NormalDist().inv_cdf(quantile)
    sd_blocks = math.sqrt(cost.output_var) / BLOCK
    assert cost.output_margin == pytest.approx(z * math.sqrt(cost.output_var))
    ledger = Ledger()
    held = []
    for n in range(1, 65):
        ledger.open(0.0, hold)
        held.append(ledger.reserved_blocks)
        root_n = z * math.sqrt(n) * sd_blocks
        # N expected blocks plus z * sqrt(N) deviations (each rounded up once), or the largest
        # single request's own margin while that is more; never the sum of their own.
        expected = n * hold.base + max(root_n, hold.own - hold.base)
        assert min(n * hold.own, expected) <= held[-1]
        assert held[-1] <= min(n * hold.own, expected + 1 + math.sqrt(n))
    assert held[0] == hold.own
    assert held[63] < 0.6 * 64 * hold.own  # the sum of 64 p90s is far above their total's p90
    assert all(b > a for a, b in zip(held, held[1:], strict=False))  # and it still grows


def test_a_set_never_holds_less_than_its_expected_blocks_nor_more_than_its_own() -> None:
    rng = random.Random(1)
    for _ in range(200):
        holds = []
        for _ in range(rng.randint(1, 20)):
            base = rng.randint(0, 50)
            holds.append(Hold(base + rng.randint(0, 40), base, rng.randint(0, 900)))
        pool = KVPool()
        for h in holds:
            pool.add(h)
        own, base = sum(h.own for h in holds), sum(h.base for h in holds)
        assert base + max(h.own - h.base for h in holds) <= pool.held or pool.held == own
        assert base <= pool.held <= own


def test_releasing_every_request_in_any_order_returns_the_ledger_exactly_to_zero() -> None:
    rng = random.Random(7)
    model = CostModel()
    for length in (10, 40, 120, 900, 3000):
        model.lengths("m").observe(length)
    ledger = Ledger()
    live: dict[int, Hold] = {}
    for step in range(2000):
        if live and rng.random() < 0.45:
            ticket = rng.choice(list(live))
            ledger.close(ticket)
            del live[ticket]
        elif live and rng.random() < 0.1:  # a reply outgrew its reservation: held outright
            ticket = rng.choice(list(live))
            live[ticket] = exact(live[ticket].own + rng.randint(1, 30))
            ledger.resize(ticket, live[ticket])
        else:
            cost = model.estimate("m", "x" * rng.randint(1, 4000), rng.choice((64, 512, None)))
            live[ledger.open(float(step), cost.hold(BLOCK))] = cost.hold(BLOCK)
        held = list(live.values())
        top = max((h.own - h.base for h in held), default=0)
        assert ledger.reserved_blocks == pooled(sum(h.own for h in held),
                                                sum(h.base for h in held),
                                                sum(h.spread2 for h in held), top)
    for ticket in list(live):
        ledger.close(ticket)
    assert (ledger.inflight, ledger.reserved_blocks) == (0, 0)
    assert ledger.since(-1.0) == (0, 0)


def test_a_reply_that_outgrew_its_reservation_is_held_outright() -> None:
    cost = CostModel().estimate("m", PROMPT, 2048)
    ledger = Ledger()
    others = [ledger.open(0.0, cost.hold(BLOCK)) for _ in range(9)]
    with Lease(ledger, cost.hold(BLOCK), 0.0) as lease:
        pooled_ten = ledger.reserved_blocks
        lease.set_blocks(cost.hold(BLOCK).own + 40)
        assert lease.hold == exact(cost.hold(BLOCK).own + 40)
        assert ledger.reserved_blocks > pooled_ten
    for ticket in others:
        ledger.close(ticket)
    assert ledger.reserved_blocks == 0


def test_cached_prompt_tokens_leave_the_commitment_but_the_reply_margin_stays() -> None:
    cost = CostModel().estimate("m", "word " * 800, 256)
    whole, cached = cost.hold(BLOCK), cost.hold(BLOCK, cost.prompt_tokens // 2)
    assert whole.own - cached.own == whole.base - cached.base > 0
    assert whole.spread2 == cached.spread2
    assert cost.hold(BLOCK, cost.prompt_tokens * 2).base == math.ceil(
        math.ceil(cost.output_mean) / BLOCK)


def test_an_exact_reply_has_no_spread() -> None:
    cost = CostModel().estimate("m", PROMPT, 300, ignore_eos=True)
    assert cost.hold(BLOCK) == exact(cost.reserve_blocks(BLOCK))


def test_commitments_pool_per_backend_and_return_to_zero() -> None:
    commitments = Commitments()
    a, b = Hold(40, 20, 100), Hold(12, 12, 0)
    for _ in range(4):
        commitments.add("x", a)
    commitments.add("y", b)
    assert commitments.held == {"x": 80 + 20, "y": 12}  # max(ceil(sqrt(400)), 20) = 20
    for _ in range(4):
        commitments.remove("x", a)
    commitments.remove("y", b)
    assert commitments.held == {"x": 0, "y": 0}


def test_a_hold_below_its_expected_blocks_is_refused() -> None:
    with pytest.raises(ValueError):
        Ledger().open(0.0, Hold(3, 5, 0))
    with pytest.raises(ValueError):
        Ledger().open(0.0, -1)


def test_a_backend_takes_as_many_requests_as_their_pooled_hold_fits_under_the_mark() -> None:
    fleet = Fleet([BackendSpec("a", "http://127.0.0.1/a", ("m",))], max_snapshot_age=100.0)
    fleet.record_scrape("a", BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=2000,
                                             kv_free_blocks=2000, block_size=BLOCK, running=0,
                                             waiting=0))
    dispatcher = Dispatcher(fleet, build_router("cost", PolicyContext(rng=random.Random(0))),
                            config=DispatchConfig())
    placed: list[Dispatch] = []
    while True:
        out = dispatcher.submit(Job(f"j{len(placed)}", "m", PROMPT, max_tokens=2048), 1.0)
        if not isinstance(out, Dispatch):
            break
        placed.append(out)
    assert isinstance(out, Waiting)
    own = sum(d.lease.blocks for d in placed)
    held = fleet.candidate("a", 1.0).reserved_blocks
    limit = DispatchConfig().high_water * 2000
    # Summed, their own reservations would have stopped admission at limit / own each; pooled,
    # the backend takes well over that and still holds no more than the mark.
    assert held <= limit < own
    assert len(placed) >= 1.5 * limit // placed[0].lease.blocks
    for d in placed:
        dispatcher.finish(d, 2.0)
    assert fleet.candidate("a", 2.0).reserved_blocks == 0
