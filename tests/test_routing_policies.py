"""Every policy by name, as users know it: what each one picks, and how weights reshape it."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from routing.policies import (
    DEFAULT_POLICY,
    POLICIES,
    PolicyContext,
    build_router,
    policy_names,
    scorer_names,
)
from routing.policy import Router
from routing.scheduling.cycle import CycleState
from routing.state import Candidate
from tests.test_routing_scorers import PROMPT, cand, context_for, tpot_pred

ALL = ("cache_aware", "cost", "dynamo_kv", "gie_default", "kv_util", "least_kv",
       "least_request", "power_of_two", "precise_prefix", "prefix_hash", "random", "round_robin")


def router(name: str, seed: int = 0, **weights: float) -> Router:
    return build_router(name, PolicyContext(rng=random.Random(seed), weights=weights))


def pick(r: Router, pool: list[Candidate], ctx: CycleState | None = None) -> str:
    return r.route(ctx or context_for(pool), pool).backend_id


def test_every_policy_of_the_issue_is_registered_and_cost_is_the_default() -> None:
    assert policy_names() == tuple(sorted(ALL)) == tuple(sorted(POLICIES))
    assert DEFAULT_POLICY == "cost"


@pytest.mark.parametrize("name", ALL)
def test_every_policy_is_constructible_by_name_and_routes(name: str) -> None:
    r = router(name)
    assert r.name == name
    pool = [cand("a"), cand("b", inflight=2, waiting=3)]
    assert pick(r, pool, context_for(pool, prompt=PROMPT)) in {"a", "b"}


def test_each_build_is_a_fresh_router() -> None:
    assert router("round_robin") is not router("round_robin")


@pytest.mark.parametrize(
    ("name", "weights", "message"),
    [("cost", {"queue": 1.0}, "has no scorer 'queue'"),
     ("round_robin", {"ttft": 1.0}, "its scorers: none"),
     ("kv_util", {"prefix": -1.0}, "weights must be >= 0")],
    ids=["a weight for a scorer the policy lacks is an error naming its scorers",
         "a policy without scorers takes no weights",
         "negative weights are an error"],
)
def test_bad_weights_fail_at_construction(name: str, weights: dict[str, float],
                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_router(name, PolicyContext(weights=weights))


def test_scorer_names_list_what_each_policy_can_weigh() -> None:
    assert scorer_names("cost") == (
        "goodput", "preemption", "prefill_load", "prefix", "session", "ttft")
    assert scorer_names("kv_util") == ("kv_cache", "prefix", "queue")
    assert scorer_names("round_robin") == ()


def test_cost_picks_the_lowest_predicted_ttft() -> None:
    pool = [cand("queued", waiting=6), cand("idle"), cand("busy", running=200)]
    assert pick(router("cost"), pool, context_for(pool)) == "idle"


def test_cost_sends_a_request_away_from_a_fast_backend_it_would_push_past_the_tpot_target(
) -> None:
    # "fast" would give the first token soonest, but sixty replies there would cross 50 ms.
    pool = [cand("fast"), cand("roomy")]
    predictions = {"fast": tpot_pred(55, 45, 60, ttft_ms=20),
                   "roomy": tpot_pred(31, 30, 10, ttft_ms=60)}
    ctx = context_for(pool)
    ctx.predictions = predictions
    assert pick(router("cost"), pool, ctx) == "roomy"
    assert pick(router("cost", goodput=0.0), pool, ctx) == "fast"


def test_cost_never_picks_a_backend_the_request_would_push_past_its_high_water_mark() -> None:
    # "full" has no queue (the lowest TTFT) but only 50 free blocks; the request needs 110.
    pool = [cand("full", free=50), cand("queued", waiting=6)]
    assert pick(router("cost"), pool, context_for(pool)) == "queued"


def test_cost_prefers_the_backend_holding_the_prompts_prefix_when_load_is_even() -> None:
    pool = [cand("a"), cand("b")]
    ctx = context_for(pool, matched={"b": 8}, prompt=PROMPT)
    assert {pick(router("cost", seed), pool, ctx) for seed in range(10)} == {"b"}


def test_cost_session_affinity_is_a_preference_not_a_pin() -> None:
    even = [cand("a"), cand("b")]
    assert pick(router("cost"), even, context_for(even, session_backend="b")) == "b"
    # A long queue on the session's backend outweighs the affinity.
    skewed = [cand("a"), cand("b", waiting=8)]
    assert pick(router("cost"), skewed, context_for(skewed, session_backend="b")) == "a"


def test_weights_reshape_the_cost_policy() -> None:
    skewed = [cand("a"), cand("b", waiting=8)]
    ctx = context_for(skewed, session_backend="b")
    assert pick(router("cost", session=10.0), skewed, ctx) == "b"


def test_kv_util_weighs_prefix_3_over_queue_2_and_kv_2() -> None:
    # b holds the whole prefix but is a little busier and fuller than a: prefix (3) wins.
    pool = [cand("a", free=900, waiting=0), cand("b", free=800, waiting=1)]
    ctx = context_for(pool, matched={"b": 8}, prompt=PROMPT)
    assert pick(router("kv_util"), pool, ctx) == "b"
    # Without the prefix, the emptier and shorter-queued backend wins.
    assert pick(router("kv_util"), pool, context_for(pool, prompt=PROMPT)) == "a"


def test_least_request_picks_the_fewest_in_flight() -> None:
    pool = [cand("a", inflight=3), cand("b", inflight=1), cand("c", inflight=2)]
    assert pick(router("least_request"), pool) == "b"


def test_power_of_two_picks_the_lighter_of_a_pair() -> None:
    pool = [cand("a", inflight=3), cand("b", inflight=1)]
    assert {pick(router("power_of_two", seed), pool) for seed in range(20)} == {"b"}


def test_random_spreads_over_every_backend() -> None:
    r = router("random", 1)
    pool = [cand("a"), cand("b", inflight=5), cand("c")]
    counts = Counter(pick(r, pool) for _ in range(300))
    assert set(counts) == {"a", "b", "c"}


def test_prefix_hash_keeps_a_prefix_on_one_backend() -> None:
    pool = [cand(f"b{i}") for i in range(5)]
    r = router("prefix_hash")
    assert len({pick(r, pool, context_for(pool, prompt=PROMPT)) for _ in range(10)}) == 1
