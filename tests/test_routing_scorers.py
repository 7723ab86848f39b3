"""Filters, scorers and pickers, one rule per row: what each rewards, what each drops. Scorers
see the whole list at once; a score is a function of the cycle state and the candidate."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

import pytest

from routing.backend_work import BackendWork
from routing.cost import RequestCost
from routing.load import kv_utilization, queue_depth
from routing.policy import Scored, Scorer
from routing.predict import predict
from routing.prefix import prefix_chain
from routing.scheduling.admission import kv_admissible
from routing.scheduling.affinity import (
    PrefixAffinityScorer,
    PrefixHashScorer,
    SessionAffinityScorer,
)
from routing.scheduling.cycle import CycleState
from routing.scheduling.filters import HighWaterFilter
from routing.scheduling.goodput import GoodputScorer
from routing.scheduling.latency import PreemptionScorer, PrefillLoadScorer, TtftScorer
from routing.scheduling.load_scorers import (
    UNKNOWN_KV_SCORE,
    KvUtilizationScorer,
    LeastRequestScorer,
    QueueScorer,
)
from routing.scheduling.pickers import PowerOfTwoPicker, RandomPicker
from routing.slo import SloTargets
from routing.state import BackendSnapshot, BackendSpec, Candidate
from routing.ttft import BackendProfile, Prediction

PROFILE = BackendProfile()
TOTAL = 1000


def cost(prompt: int = 1600, output: float = 160.0) -> RequestCost:
    return RequestCost(
        model="m", prompt_chars=4 * prompt, prompt_tokens=prompt, exact=False,
        tokens_per_char=0.25, max_tokens=None, output_p50=int(output), output_p90=int(output),
        output_mean=output, output_var=0.0, typical_prompt_tokens=1000.0,
        mean_output_all=output, inflight_growth_mean=0.0, inflight_growth_var=0.0,
    )


def cand(backend_id: str, *, free: int | None = TOTAL, total: int | None = TOTAL,
         running: int = 0, waiting: int | None = 0, inflight: int = 0, stale: bool = False,
         reserved: int = 0, since: int = 0, since_blocks: int = 0, snapshot: bool = True,
         weight: float = 1.0) -> Candidate:
    snap = BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=total,
                           kv_free_blocks=free, block_size=16, running=running,
                           waiting=waiting) if snapshot else None
    spec = BackendSpec(backend_id, f"http://127.0.0.1/{backend_id}", ("m",), weight=weight)
    return Candidate(spec, True, snap, stale or snap is None, inflight, reserved, since,
                     since_blocks)


def context_for(pool: list[Candidate], request: RequestCost | None = None, *,
                matched: Mapping[str, int] | None = None, session_backend: str | None = None,
                prompt: str = "") -> CycleState:
    """The cycle state the Dispatcher would build for `pool` (predictions at PROFILE)."""
    request = request or cost()
    predictions = {c.id: predict(c, request, 0, PROFILE) for c in pool}
    chain = prefix_chain(prompt, model="m") if prompt else None
    return CycleState("m", request, chain=chain, session_backend=session_backend,
                      predictions=predictions, matched=matched or {}, pool=pool,
                      admissible=frozenset(c.id for c in pool if kv_admissible(predictions[c.id])))


def bare(predictions: Mapping[str, Prediction] | None = None) -> CycleState:
    """A cycle with nothing but the given predictions (no chain, no pool)."""
    return CycleState("m", cost(), predictions=predictions or {})


def one(scorer: Scorer, cycle: CycleState, candidate: Candidate) -> float:
    """`candidate`'s score, scored alone."""
    return scorer.score(cycle, [candidate])[0]


# HighWaterFilter

@pytest.mark.parametrize(
    ("frees", "kept"),
    [
        ({"a": 1000, "b": 50}, ["a"]),
        ({"a": 1000, "b": 1000}, ["a", "b"]),
        ({"a": 50, "b": 60}, ["a", "b"]),
    ],
    ids=["a backend that cannot fit the request's KV is filtered",
         "every backend that fits is kept",
         "when none fits every backend passes: admission already decided to send it"],
)
def test_high_water_filter(frees: dict[str, int], kept: list[str]) -> None:
    pool = [cand(b, free=f) for b, f in frees.items()]
    survivors = HighWaterFilter().filter(context_for(pool), pool)
    assert [c.id for c in survivors] == kept


def test_a_backend_of_unknown_kv_capacity_is_not_filtered() -> None:
    pool = [cand("a", free=None, total=None), cand("b", free=1000)]
    survivors = HighWaterFilter().filter(context_for(pool), pool)
    assert [c.id for c in survivors] == ["a", "b"]


def test_a_backend_at_high_preemption_risk_is_filtered() -> None:
    # 400 free blocks: the request's peak (110 blocks) fits under the mark, but 50 running
    # sequences each still growing by ~200 tokens will need ~625 more blocks.
    risky = replace(cost(), inflight_growth_mean=200.0, inflight_growth_var=100.0)
    pool = [cand("a", free=1000), cand("b", free=600, running=50)]
    ctx = context_for(pool, risky)
    assert ctx.predictions["b"].fits and ctx.predictions["b"].preemption_risk > 0.5
    assert [c.id for c in HighWaterFilter().filter(ctx, pool)] == ["a"]


# TtftScorer and PreemptionScorer

def test_ttft_scorer_gives_1_to_the_fastest_and_less_the_longer_the_predicted_ttft() -> None:
    pool = [cand("fast"), cand("queue4", waiting=4), cand("queue10", waiting=10)]
    ctx = context_for(pool)
    scores = {c.id: one(TtftScorer(), ctx, c) for c in pool}
    assert scores["fast"] == 1.0
    assert 1.0 > scores["queue4"] > scores["queue10"] > 0.0
    # The score is the ratio of the best prediction to this one.
    ratio = ctx.best_ttft_s() / ctx.predictions["queue10"].predicted_ttft_s
    assert scores["queue10"] == pytest.approx(ratio)


def test_a_backend_that_can_never_fit_the_prompt_scores_zero_on_ttft() -> None:
    pool = [cand("ok"), cand("tiny", free=10, total=10)]
    ctx = context_for(pool)
    assert one(TtftScorer(), ctx, pool[1]) == 0.0


def test_preemption_scorer_is_one_minus_the_risk() -> None:
    pool = [cand("a")]
    fake = Prediction(0, 0, 0, 0, 0.01, 0.3, True, False, 100, 0, 0, "x")
    ctx = bare({"a": fake})
    assert one(PreemptionScorer(), ctx, pool[0]) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("sent_per_s", "prompt", "score"),
    [(0, 0, 1.0), (15_000, 0, 0.5), (15_000, 75_000, 0.0), (60_000, 0, 0.0)],
    ids=["nothing sent: all of its time is left to decoding",
         "prompts at half its prefill speed leave half",
         "this prompt's own prefill counts too (75,000 tokens over the 5 s window)",
         "more prefill than it can do leaves nothing, never below 0"],
)
def test_prefill_load_scorer_is_the_time_recent_prefills_leave_to_decoding(
    sent_per_s: int, prompt: int, score: float
) -> None:
    work = BackendWork(tau_s=5.0)
    work.dispatched(0.0, 5 * sent_per_s, 0.0, tokens_per_s=1e9)  # one dispatch at t = 0
    pred = predict(cand("a"), cost(prompt=max(1, prompt)), 0,
                   BackendProfile(prefill_tokens_per_s=30_000.0), work=work, now=0.0)
    ctx = bare({"a": pred})
    # At t = 0 the rate is what was sent over the 5 s window: sent_per_s.
    assert one(PrefillLoadScorer(), ctx, cand("a")) == pytest.approx(
        score, abs=1e-4)


def test_prefill_load_scorer_without_a_prediction_scores_zero() -> None:
    assert one(PrefillLoadScorer(), bare(), cand("a")) == 0.0


def tpot_pred(after_ms: float, before_ms: float, batch: int, *, others_ms: float | None = None,
              ttft_ms: float = 10.0) -> Prediction:
    """A prediction that only carries TTFT and TPOT figures (with `batch` decoding once admitted;
    the others' TPOT with this request there is `after_ms` unless given)."""
    return Prediction(0, 0, 0, 0, ttft_ms / 1e3, 0.0, True, False, 100, 0, 0, "x",
                      tpot_batch=batch, predicted_tpot_s=after_ms / 1e3,
                      tpot_before_s=before_ms / 1e3,
                      tpot_others_s=(after_ms if others_ms is None else others_ms) / 1e3)


def goodput_score(pred: Prediction, tpot_target_s: float = 0.05,
                  ttft_target_s: float = 1.0) -> float:
    ctx = bare({"a": pred})
    return one(GoodputScorer(SloTargets(ttft_target_s, tpot_target_s)), ctx, cand("a"))


@pytest.mark.parametrize(
    ("better", "worse"),
    [(tpot_pred(20, 20, 1), tpot_pred(80, 80, 1)),
     (tpot_pred(30, 29, 10), tpot_pred(60, 59, 10)),
     (tpot_pred(120, 115, 50), tpot_pred(45, 40, 50)),
     (tpot_pred(30, 25, 40), tpot_pred(47, 42, 40)),
     (tpot_pred(30, 30, 1, ttft_ms=200), tpot_pred(30, 30, 1, ttft_ms=3000)),
     (tpot_pred(30, 30, 20, others_ms=30), tpot_pred(30, 30, 20, others_ms=45))],
    ids=["an idle backend within the target beats one past it",
         "a backend whose predicted TPOT exceeds the target scores lower",
         "pushing fifty replies towards the target scores below adding to fifty already past it",
         "pushing forty replies towards the target scores below keeping them well within it",
         "a backend whose TTFT would miss its target scores lower, whatever its TPOT",
         "stalling the replies there with a long prefill scores lower"],
)
def test_goodput_scorer_prefers_the_backend_that_keeps_more_requests_within_both_slos(
    better: Prediction, worse: Prediction
) -> None:
    assert goodput_score(better) > goodput_score(worse)


@pytest.mark.parametrize(
    ("pred", "lo", "hi"),
    [(tpot_pred(5, 5, 1), 0.99, 1.0),
     (tpot_pred(500, 500, 30), 0.499, 0.501),
     (tpot_pred(50, 10, 1), 0.6, 0.7),
     (tpot_pred(5, 5, 1, ttft_ms=1000), 0.6, 0.7),
     (tpot_pred(60, 40, 80), 0.0, 0.05)],
    ids=["a sure success that costs nobody scores about 1",
         "a sure miss that costs nobody scores 1/2",
         "at the TPOT target the reply meets it half the time: 2/3",
         "at the TTFT target likewise: 2/3",
         "one the request pushes eighty replies past the target from within it scores near 0"],
)
def test_goodput_scorer_maps_the_expected_change_in_requests_meeting_both_slos(
    pred: Prediction, lo: float, hi: float
) -> None:
    assert lo <= goodput_score(pred) <= hi


def test_goodput_scorer_never_goes_flat_however_many_misses_a_backend_would_cause() -> None:
    assert goodput_score(tpot_pred(60, 40, 80)) > goodput_score(tpot_pred(60, 40, 160)) > 0.0


def test_goodput_scorer_targets_are_the_slos() -> None:
    pred = tpot_pred(80, 80, 1)
    assert goodput_score(pred, tpot_target_s=0.2) > 0.95 > goodput_score(pred)
    slow = tpot_pred(5, 5, 1, ttft_ms=3000)
    assert goodput_score(slow, ttft_target_s=10.0) > 0.95 > goodput_score(slow)
    with pytest.raises(ValueError):
        SloTargets(tpot_s=0.0)


def test_goodput_scorer_without_a_context_scores_zero() -> None:
    assert one(GoodputScorer(), bare(), cand("a")) == 0.0


# Prefix and session affinity

PROMPT = "x" * 256 * 8  # eight prefix blocks


@pytest.mark.parametrize(
    ("matched", "inflight", "bound", "expected"),
    [(8, 0, None, 1.0), (4, 0, None, 0.5), (0, 0, None, 0.0), (8, 9, None, 1.0),
     (8, 9, 1.25, 0.0), (8, 1, 1.25, 1.0)],
    ids=["holding the whole prefix scores 1", "half the prefix scores one half",
         "none of it scores 0", "without a bound load does not matter",
         "a backend above the bounded load scores 0 however much it holds",
         "a backend within the bound keeps its affinity"],
)
def test_prefix_affinity(matched: int, inflight: int, bound: float | None,
                         expected: float) -> None:
    pool = [cand("a", inflight=inflight), cand("b", inflight=1), cand("c", inflight=1)]
    ctx = context_for(pool, matched={"a": matched}, prompt=PROMPT)
    assert one(PrefixAffinityScorer(bound), ctx, pool[0]) == expected


@pytest.mark.parametrize(("last", "expected"), [("a", 1.0), ("b", 0.0), (None, 0.0)],
                         ids=["the session's last backend scores 1", "another backend scores 0",
                              "no session history scores 0"])
def test_session_affinity(last: str | None, expected: float) -> None:
    pool = [cand("a"), cand("b")]
    ctx = context_for(pool, session_backend=last)
    assert one(SessionAffinityScorer(), ctx, pool[0]) == expected


# Load scorers

@pytest.mark.parametrize(("inflight", "expected"), [(0, 1.0), (1, 0.5), (9, 0.1)],
                         ids=["an idle backend scores 1", "one in flight scores one half",
                              "the longest queue gets the lowest score"])
def test_least_request(inflight: int, expected: float) -> None:
    assert one(LeastRequestScorer(), bare(), cand("a", inflight=inflight)) == expected


@pytest.mark.parametrize(
    ("backend", "expected"), [("short", 1.0), ("mid", 0.5), ("long", 0.0)],
    ids=["the shortest waiting queue scores 1", "halfway scores one half",
         "the longest predicted queue gets the lowest score"],
)
def test_queue_scorer_is_min_max_normalised_over_the_pool(backend: str, expected: float) -> None:
    pool = [cand("short", waiting=2), cand("mid", waiting=4, since=2), cand("long", waiting=10)]
    ctx = context_for(pool)
    assert one(QueueScorer(), ctx, next(c for c in pool if c.id == backend)) == expected


def test_queue_depth_of_a_stale_backend_is_the_gateways_in_flight_count() -> None:
    assert queue_depth(cand("a", waiting=50, stale=True, inflight=3)) == 3.0


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [(cand("a", free=1000), 1.0), (cand("a", free=250), 0.25),
     (cand("a", free=500, since_blocks=100), 0.4),
     (cand("a", free=None, total=None), UNKNOWN_KV_SCORE)],
    ids=["an empty cache scores 1", "a quarter free scores a quarter",
         "blocks sent since the scrape count as used",
         "unknown KV use is neither favoured nor shunned"],
)
def test_kv_utilization_scorer_is_the_free_fraction(candidate: Candidate,
                                                    expected: float) -> None:
    assert one(KvUtilizationScorer(), bare(), candidate) == pytest.approx(expected)
    if expected != UNKNOWN_KV_SCORE:
        assert kv_utilization(candidate) == pytest.approx(1.0 - expected)


def test_a_stale_reading_is_never_emptier_than_the_gateways_reservations() -> None:
    assert kv_utilization(cand("a", free=900, stale=True, reserved=600)) == pytest.approx(0.6)


# Prefix hashing

def hash_pick(pool: list[Candidate], prompt: str, scorer: PrefixHashScorer) -> str:
    ctx = context_for(pool, prompt=prompt)
    winners = [c.id for c in pool if one(scorer, ctx, c) == 1.0]
    assert len(winners) == 1
    return winners[0]


def test_requests_sharing_a_prefix_hash_to_the_same_backend() -> None:
    pool = [cand(f"b{i}") for i in range(4)]
    scorer = PrefixHashScorer(depth=2)
    shared = "system prompt " * 100
    picks = {hash_pick(pool, shared + f" question {i}" * 30, scorer) for i in range(10)}
    assert len(picks) == 1
    spread = {hash_pick(pool, f"{i} other prompt " * 100, scorer) for i in range(40)}
    assert len(spread) == 4  # different prefixes land everywhere


def test_a_hot_prefix_spills_to_the_next_backend_past_the_load_bound() -> None:
    pool = [cand(f"b{i}") for i in range(4)]
    scorer = PrefixHashScorer(bound=1.25)
    home = hash_pick(pool, PROMPT, scorer)
    loaded = [cand(c.id, inflight=8 if c.id == home else 0) for c in pool]
    assert hash_pick(loaded, PROMPT, scorer) != home


# Pickers

def scored(*pairs: tuple[str, float]) -> list[Scored]:
    return [Scored(cand(b), s) for b, s in pairs]


def test_random_picker_ignores_scores_and_visits_every_survivor() -> None:
    picker = RandomPicker(random.Random(3))
    counts = Counter(picker.pick(scored(("a", 0.0), ("b", 1.0), ("c", 0.5))).id
                     for _ in range(600))
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 120


def test_power_of_two_never_picks_the_worst_of_three_and_favours_the_best() -> None:
    picker = PowerOfTwoPicker(random.Random(5))
    counts = Counter(picker.pick(scored(("a", 0.1), ("b", 0.5), ("c", 0.9))).id
                     for _ in range(600))
    assert "a" not in counts  # it always loses its pair
    assert counts["c"] > counts["b"]  # c wins both of its pairs, b one of two


@pytest.mark.parametrize("picker", [RandomPicker(random.Random(0)),
                                    PowerOfTwoPicker(random.Random(0))],
                         ids=["random", "power of two"])
def test_a_single_survivor_is_picked(picker: RandomPicker | PowerOfTwoPicker) -> None:
    assert picker.pick(scored(("only", 0.0))).id == "only"
