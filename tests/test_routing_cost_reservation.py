"""What a request's KV reservation holds: exactly its max_tokens when the request dictates the
reply's length, its cap (max_tokens, else the context left) as a bound, a learned quantile in
between; cut replies are learned as censored; a stream that outgrows its lease grows it."""

from __future__ import annotations

import random

import pytest

from routing.cost import CostModel
from routing.dispatch import Completion, Dispatch, DispatchConfig, Dispatcher, Job
from routing.fleet import Fleet
from routing.policies import PolicyContext, build_router
from routing.state import BackendSnapshot, BackendSpec

MODEL = "m"
BLOCK = 16
PROMPT = "word " * 400  # 2,000 characters: 500 estimated tokens


def taught(model: CostModel, lengths: list[int], *, reason: str = "stop",
           max_tokens: int | None = None) -> CostModel:
    cost = model.estimate(MODEL, "x", max_tokens)
    for n in lengths:
        model.observe(cost, prompt_tokens=None, completion_tokens=n, finish_reason=reason)
    return model


@pytest.mark.parametrize(
    ("max_tokens", "min_tokens", "ignore_eos"),
    [(1500, 0, True), (64, 0, True), (1500, 1500, False), (300, 999, False)],
    ids=["ignore-eos", "ignore-eos-short", "min-tokens-at-the-cap", "min-tokens-past-the-cap"],
)
def test_a_reply_whose_length_the_request_dictates_reserves_exactly_max_tokens(
    max_tokens: int, min_tokens: int, ignore_eos: bool
) -> None:
    model = taught(CostModel(), [32] * 50, reason="length", max_tokens=32)
    cost = model.estimate(MODEL, PROMPT, max_tokens, min_tokens=min_tokens,
                          ignore_eos=ignore_eos)
    assert cost.exact_output
    assert (cost.reserve_output, cost.output_p50, cost.output_mean, cost.output_var) == (
        max_tokens, max_tokens, max_tokens, 0.0)
    assert cost.reserve_blocks(BLOCK) == -(-(cost.prompt_tokens + max_tokens) // BLOCK)


@pytest.mark.parametrize("min_tokens", [10, 200, 800], ids=lambda m: f"floor-{m}")
def test_min_tokens_is_a_floor_under_every_figure(min_tokens: int) -> None:
    cost = taught(CostModel(), [50] * 300).estimate(MODEL, PROMPT, 1000, min_tokens=min_tokens)
    assert not cost.exact_output
    assert min(cost.output_p50, cost.reserve_output, cost.output_mean) >= min_tokens


@pytest.mark.parametrize(
    ("lengths", "max_tokens"),
    [([4000] * 300, 100), ([20, 2000] * 200, 1000), ([1] * 10, 1), ([500] * 300, 500)],
    ids=["all-longer-than-the-cap", "wide-spread", "one-token", "cap-at-the-typical"],
)
def test_the_reserved_quantile_never_exceeds_max_tokens(lengths: list[int],
                                                        max_tokens: int) -> None:
    cost = taught(CostModel(), lengths).estimate(MODEL, PROMPT, max_tokens)
    assert max(cost.output_p50, cost.output_p90, cost.reserve_output) <= max_tokens
    assert cost.output_mean <= max_tokens


@pytest.mark.parametrize(
    ("context", "ignore_eos", "expected"),
    [(4096, True, 4096 - 500), (4096, False, 4096 - 500), (600, False, 100), (400, True, 1)],
    ids=["ignore-eos-runs-to-the-context", "long-replies-bounded-by-the-context",
         "little-context-left", "prompt-past-the-context"],
)
def test_without_max_tokens_the_cap_is_the_context_left_after_the_prompt(
    context: int, ignore_eos: bool, expected: int
) -> None:
    model = taught(CostModel(context_tokens=context), [20_000] * 300)
    cost = model.estimate(MODEL, PROMPT, None, ignore_eos=ignore_eos)
    assert cost.max_tokens == expected
    assert cost.reserve_output == expected


def test_replies_cut_at_their_max_tokens_do_not_shrink_a_longer_requests_reservation() -> None:
    cut = taught(CostModel(), [32] * 6, reason="length", max_tokens=32)
    counted = taught(CostModel(), [32] * 6, reason="stop", max_tokens=32)
    fresh = CostModel()
    assert (cut.estimate(MODEL, PROMPT, 1500).reserve_output
            >= fresh.estimate(MODEL, PROMPT, 1500).reserve_output
            > counted.estimate(MODEL, PROMPT, 1500).reserve_output)


def test_a_dictated_reply_teaches_nothing_about_natural_lengths() -> None:
    model = CostModel()
    before = model.estimate(MODEL, PROMPT, 1000)
    dictated = model.estimate(MODEL, PROMPT, 1500, ignore_eos=True)
    for _ in range(100):
        model.observe(dictated, prompt_tokens=None, completion_tokens=1500,
                      finish_reason="length")
    assert model.estimate(MODEL, PROMPT, 1000) == before


# The Dispatcher: the finish reason reaches the cost model, and leases grow as replies stream.

def fleet_of(total: int, free: int) -> Fleet:
    fleet = Fleet([BackendSpec("a", "http://127.0.0.1/a", (MODEL,))], max_snapshot_age=100.0)
    fleet.record_scrape("a", BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=total,
                                             kv_free_blocks=free, block_size=BLOCK, running=0,
                                             waiting=0))
    return fleet


def dispatcher(fleet: Fleet) -> Dispatcher:
    return Dispatcher(fleet, build_router("cost", PolicyContext(rng=random.Random(0))),
                      config=DispatchConfig())


def placed(d: Dispatcher, job: Job) -> Dispatch:
    out = d.submit(job, 0.0)
    assert isinstance(out, Dispatch), out
    return out


@pytest.mark.parametrize(("reason", "lower"), [("length", False), ("stop", True)],
                         ids=["cut-replies-are-censored", "ended-replies-are-samples"])
def test_the_finish_reason_reaches_the_cost_model(reason: str, lower: bool) -> None:
    d = dispatcher(fleet_of(10_000, 10_000))
    fresh = d.cost_model.estimate(MODEL, PROMPT, 1500).reserve_output
    for i in range(20):
        dispatch = placed(d, Job(f"r{i}", MODEL, PROMPT, max_tokens=32))
        d.finish(dispatch, 1.0, Completion(completion_tokens=32, finish_reason=reason))
    learned = d.cost_model.estimate(MODEL, PROMPT, 1500).reserve_output
    assert (learned < fresh) is lower


def test_a_stream_past_its_reservation_grows_its_lease_up_to_its_cap() -> None:
    fleet = fleet_of(10_000, 10_000)
    d = dispatcher(fleet)
    dispatch = placed(d, Job("r", MODEL, PROMPT, max_tokens=4000, stream=True))
    first = dispatch.lease.blocks
    reserved = first * BLOCK - dispatch.cost.prompt_tokens
    assert d.grow(dispatch, 1, 0.1) == reserved  # nothing to grow yet: call again there
    assert dispatch.lease.blocks == first
    emitted = reserved
    while (at := d.grow(dispatch, emitted, 0.2)) is not None:
        assert at > emitted
        assert fleet.candidate("a", 0.2).reserved_blocks == dispatch.lease.blocks
        emitted = at
    assert dispatch.lease.blocks == -(-(dispatch.cost.prompt_tokens + 4000) // BLOCK)
    d.finish(dispatch, 1.0)
    assert fleet.candidate("a", 1.0).reserved_blocks == 0
    assert d.grow(dispatch, 5000, 1.1) is None  # over: nothing held, nothing grows


def test_a_grown_lease_holds_back_the_next_request() -> None:
    # 300 blocks, high-water 270: a 500-token prompt with a short reservation fits twice until
    # the first reply streams far past its reservation.
    fleet = fleet_of(300, 300)
    d = dispatcher(fleet)
    first = placed(d, Job("a", MODEL, PROMPT, max_tokens=3000, stream=True))
    emitted = 1
    while (at := d.grow(first, emitted, 0.1)) is not None and emitted < 2500:
        emitted = at
    assert first.lease.blocks * BLOCK >= first.cost.prompt_tokens + 2500
    assert not isinstance(d.submit(Job("b", MODEL, PROMPT, max_tokens=3000), 0.2), Dispatch)
