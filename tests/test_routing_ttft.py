"""TTFT and preemption-risk prediction for one request on one candidate backend, and the online
per-backend speed profile."""

from __future__ import annotations

import math
import random

import pytest

from routing.cost import RequestCost
from routing.state import BackendSnapshot, BackendSpec, Candidate
from routing.ttft import (
    MAX_PREFILL_BUSY,
    UNKNOWN_RISK,
    BackendProfile,
    Prediction,
    PrefillRate,
    ProfileEstimator,
    predict,
)

PROFILE = BackendProfile(prefill_tokens_per_s=10_000.0, overhead_s=0.005, decode_base_s=0.01,
                         decode_per_seq_s=0.0001)
TOTAL = 1000  # KV blocks of 16 tokens


def cost(prompt: int = 1600, output: float = 160.0, *, var: float = 0.0,
         growth: float = 0.0, growth_var: float = 0.0, typical: float = 1000.0) -> RequestCost:
    return RequestCost(
        model="m", prompt_chars=4 * prompt, prompt_tokens=prompt, exact=False,
        tokens_per_char=0.25, max_tokens=None, output_p50=int(output), output_p90=int(output),
        output_mean=output, output_var=var, typical_prompt_tokens=typical,
        mean_output_all=output, inflight_growth_mean=growth, inflight_growth_var=growth_var,
    )


def snapshot(*, free: int | None = TOTAL, total: int | None = TOTAL, running: int | None = 0,
             waiting: int | None = 0, hit_rate: float | None = None, block_size: int = 16,
             usage: float | None = None) -> BackendSnapshot:
    return BackendSnapshot(taken_at=0.0, format="vllm", kv_total_blocks=total, kv_free_blocks=free,
                           kv_usage=usage, block_size=block_size, running=running, waiting=waiting,
                           prefix_cache_hit_rate=hit_rate)


def backend(snap: BackendSnapshot | None = None, *, stale: bool = False, inflight: int = 0,
            reserved: int = 0, since: int = 0, since_blocks: int = 0,
            max_batch_total_tokens: int | None = None) -> Candidate:
    spec = BackendSpec("b0", "http://127.0.0.1:8001", models=("m",),
                       max_batch_total_tokens=max_batch_total_tokens)
    return Candidate(spec, True, snap, stale or snap is None, inflight, reserved, since,
                     since_blocks)


def run(candidate: Candidate, request: RequestCost | None = None, cached: int = 0) -> Prediction:
    return predict(candidate, request or cost(), cached, PROFILE)


@pytest.mark.parametrize(
    ("free", "since_blocks", "fits"),
    [(1000, 0, True), (210, 0, True), (209, 0, False), (300, 91, False), (50, 0, False)],
    ids=["empty", "just-fits", "one-block-short", "dispatched-since-scrape-count",
         "nearly-full"],
)
def test_a_backend_that_cannot_fit_the_requests_kv_under_the_high_water_mark_is_not_fit(
    free: int, since_blocks: int, fits: bool
) -> None:
    # Peak: (1600 + 160) / 16 = 110 blocks; high-water mark 900 of 1000 blocks, so it fits while
    # used (1000 - free + since_blocks) <= 790.
    p = run(backend(snapshot(free=free), since_blocks=since_blocks))
    assert p.fits is fits
    assert p.oversized is False


@pytest.mark.parametrize(
    ("high_water", "fits"), [(0.95, True), (0.82, True), (0.8, False)],
    ids=["loose", "just-under", "strict"],
)
def test_the_high_water_mark_sets_how_full_a_backend_may_get(high_water: float, fits: bool) -> None:
    # 700 used + 110 peak = 810 blocks of 1000.
    p = predict(backend(snapshot(free=300)), cost(), 0, PROFILE, high_water=high_water)
    assert p.fits is fits


def test_a_request_larger_than_the_high_water_mark_of_an_empty_backend_is_oversized() -> None:
    p = run(backend(snapshot()), cost(prompt=16 * 950, output=0.0))
    assert (p.fits, p.oversized, p.kv_wait_s) == (False, True, 0.0)
    never = run(backend(snapshot()), cost(prompt=16 * 1001, output=0.0))
    assert never.kv_wait_s == math.inf and never.predicted_ttft_s == math.inf


def test_longest_predicted_queue_gives_the_longest_predicted_ttft() -> None:
    ttfts = [run(backend(snapshot(waiting=w, free=900))).predicted_ttft_s for w in (0, 2, 8, 30)]
    assert ttfts == sorted(ttfts) and len(set(ttfts)) == 4


def test_requests_dispatched_since_the_scrape_queue_ahead_too() -> None:
    seen = run(backend(snapshot(waiting=3)))
    unseen = run(backend(snapshot(waiting=0), inflight=3, since=3, since_blocks=0))
    assert unseen.queued_prefill_s == seen.queued_prefill_s > 0


@pytest.mark.parametrize(
    ("cached", "own_tokens"), [(0, 1600), (1000, 600), (1600, 0), (5000, 0)],
    ids=["nothing-cached", "part-cached", "all-cached", "more-than-prompt"],
)
def test_a_cached_prefix_shortens_own_prefill(cached: int, own_tokens: int) -> None:
    p = run(backend(snapshot()), cached=cached)
    assert p.own_prefill_s == pytest.approx(own_tokens / PROFILE.prefill_tokens_per_s)


def test_the_backends_prefix_hit_rate_shrinks_the_queued_prefill() -> None:
    cold = run(backend(snapshot(waiting=4)))
    warm = run(backend(snapshot(waiting=4, hit_rate=0.75)))
    assert warm.queued_prefill_s == pytest.approx(cold.queued_prefill_s / 4)


def test_a_bigger_running_batch_makes_the_first_step_slower() -> None:
    steps = [run(backend(snapshot(running=r, free=900))).step_s for r in (0, 16, 128)]
    assert steps == sorted(steps) and len(set(steps)) == 3


def test_the_breakdown_adds_up_to_the_prediction() -> None:
    p = run(backend(snapshot(running=20, waiting=5, free=150)), cached=400)
    assert p.kv_wait_s > 0
    parts = p.queued_prefill_s + p.own_prefill_s + p.kv_wait_s + p.step_s
    assert p.predicted_ttft_s == pytest.approx(parts)


@pytest.mark.parametrize(
    ("free", "running"), [(100, 10), (60, 10), (20, 10), (20, 40)],
    ids=["short-by-a-few", "short-by-more", "short-by-most", "more-running-release-faster"],
)
def test_a_prompt_that_does_not_fit_the_free_blocks_waits_for_releases(
    free: int, running: int
) -> None:
    # The prompt needs 100 blocks; the running sequences hold the rest and release all of it
    # once per mean reply (160 steps).
    p = run(backend(snapshot(free=free, running=running)))
    used = TOTAL - free
    step = PROFILE.decode_step_s(running)
    assert p.kv_wait_s == pytest.approx((100 - free) / used * 160 * step)
    assert "waits for KV blocks" in p.reason or "high-water" in p.reason


@pytest.mark.parametrize(
    ("snap", "reason", "fits", "free_blocks"),
    [
        (snapshot(), "stale snapshot, ledger only: over the high-water mark", False, TOTAL - 850),
        (None, "no snapshot, ledger only: KV capacity unknown", True, None),
    ],
    ids=["stale-snapshot-that-said-idle", "no-snapshot"],
)
def test_a_stale_or_missing_snapshot_is_not_read_as_idle(
    snap: BackendSnapshot | None, reason: str, fits: bool, free_blocks: int | None
) -> None:
    # The last scrape said idle, but the gateway has 12 requests there holding 850 blocks: the
    # ledger wins, and every in-flight request counts as queued ahead.
    p = run(backend(snap, stale=True, inflight=12, reserved=850))
    assert p.predicted_ttft_s > run(backend(snapshot())).predicted_ttft_s
    assert p.queued_prefill_s == pytest.approx(12 * 1000 / PROFILE.prefill_tokens_per_s)
    assert (p.reason, p.fits, p.free_blocks) == (reason, fits, free_blocks)


@pytest.mark.parametrize(
    ("free", "reserved", "since_blocks", "free_blocks"),
    [(100, 10, 0, 100), (100, 10, 5, 95), (900, 300, 5, 700)],
    ids=["last-reading-fuller", "plus-dispatched-since", "reservations-fuller"],
)
def test_a_stale_backend_is_as_full_as_its_last_reading_or_the_ledger_whichever_is_fuller(
    free: int, reserved: int, since_blocks: int, free_blocks: int
) -> None:
    p = run(backend(snapshot(free=free), stale=True, inflight=3, reserved=reserved, since=1,
                    since_blocks=since_blocks))
    assert p.free_blocks == free_blocks


def test_without_known_capacity_backends_rank_by_inflight() -> None:
    preds = [run(backend(None, inflight=n)) for n in (0, 1, 5, 20)]
    ttfts = [p.predicted_ttft_s for p in preds]
    assert ttfts == sorted(ttfts) and len(set(ttfts)) == 4
    verdicts = {(p.fits, p.preemption_risk, p.free_blocks) for p in preds}
    assert verdicts == {(True, UNKNOWN_RISK, None)}


def test_tgi_capacity_comes_from_its_token_budget() -> None:
    snap = snapshot(free=None, total=None, running=3, waiting=0)
    p = run(backend(snap, reserved=0, max_batch_total_tokens=4000))
    assert (p.fits, p.free_blocks) == (True, 4000)  # token-granular: blocks of one token
    assert run(backend(snap, max_batch_total_tokens=1500)).fits is False


def test_usage_fraction_stands_in_for_free_blocks() -> None:
    by_usage = run(backend(snapshot(free=None, usage=0.4)))
    by_free = run(backend(snapshot(free=600)))
    assert by_usage == by_free


def test_unknown_waiting_count_falls_back_to_the_ledger() -> None:
    # llama.cpp's /slots reports processing slots but no queue: in-flight beyond them wait.
    p = run(backend(snapshot(running=2, waiting=None), inflight=5))
    assert p.queued_prefill_s == pytest.approx(3 * 1000 / PROFILE.prefill_tokens_per_s)


def risky(running: int, free: int = 500) -> float:
    # Each running sequence adds 400 tokens (25 blocks) +- 160 while this request runs.
    request = cost(prompt=160, output=160.0, var=160.0**2, growth=400.0, growth_var=160.0**2)
    return run(backend(snapshot(running=running, free=free)), request).preemption_risk


@pytest.mark.parametrize(
    ("running", "free", "low", "high"),
    [(0, 1000, 0.0, 1e-6), (5, 500, 0.0, 1e-6), (19, 500, 0.3, 0.7), (40, 500, 0.999, 1.0)],
    ids=["empty-backend", "ample-room", "growth-about-equals-room", "growth-far-beyond-room"],
)
def test_preemption_risk_is_the_chance_that_inflight_growth_exceeds_free_kv(
    running: int, free: int, low: float, high: float
) -> None:
    # Room after the 10-block prompt: free - 10. Growth: running * 25 + 10 blocks.
    assert low <= risky(running, free) <= high


def test_preemption_risk_grows_with_the_running_batch() -> None:
    risks = [risky(n) for n in (10, 15, 18, 21, 25)]
    assert risks == sorted(risks) and len(set(risks)) == 5


def test_certain_growth_gives_a_certain_answer() -> None:
    request = cost(prompt=160, output=160.0, growth=400.0)
    assert run(backend(snapshot(running=10, free=500)), request).preemption_risk == 0.0
    assert run(backend(snapshot(running=30, free=500)), request).preemption_risk == 1.0


def test_observations_that_agree_with_the_prior_profile_leave_it_unchanged() -> None:
    est = ProfileEstimator(PROFILE)
    assert est.profile() == PROFILE
    for tokens, batch in [(100, 1), (5000, 30), (20_000, 64)] * 50:
        est.observe_tpot(batch, PROFILE.decode_step_s(batch))
        est.observe_ttft(tokens, batch, PROFILE.overhead_s + tokens / PROFILE.prefill_tokens_per_s
                         + PROFILE.decode_step_s(batch))
    learned = est.profile()
    assert learned is not PROFILE
    for field in ("prefill_tokens_per_s", "overhead_s", "decode_base_s", "decode_per_seq_s"):
        assert getattr(learned, field) == pytest.approx(getattr(PROFILE, field), rel=1e-6)


def test_profile_estimator_learns_prefill_speed_and_overhead_from_observed_ttfts() -> None:
    est = ProfileEstimator(BackendProfile())
    truth = BackendProfile(prefill_tokens_per_s=30_000.0, overhead_s=0.02)
    rng = random.Random(4)
    for _ in range(2000):
        tokens, batch = rng.randint(50, 20_000), rng.randint(0, 64)
        est.observe_tpot(batch, truth.decode_step_s(batch) * rng.uniform(0.95, 1.05))
        ideal = truth.overhead_s + tokens / truth.prefill_tokens_per_s + truth.decode_step_s(batch)
        est.observe_ttft(tokens, batch, ideal * rng.uniform(0.95, 1.05))
    learned = est.profile()
    assert learned.prefill_tokens_per_s == pytest.approx(30_000, rel=0.05)
    assert learned.overhead_s == pytest.approx(0.02, abs=0.005)


def test_profile_estimator_learns_the_decode_step_from_observed_tpots() -> None:
    est = ProfileEstimator()
    for i in range(1000):
        batch = i % 100
        est.observe_tpot(batch, 0.006 + 0.00005 * batch)
    learned = est.profile()
    assert learned.decode_base_s == pytest.approx(0.006, rel=0.01)
    assert learned.decode_per_seq_s == pytest.approx(0.00005, rel=0.01)


def test_noise_never_makes_prefill_free_or_overhead_negative() -> None:
    est = ProfileEstimator()
    for tokens in range(0, 20_000, 10):  # TTFT falling with more work: nonsense data
        est.observe_ttft(tokens, 0, 1.0 - tokens / 40_000)
    learned = est.profile()
    assert learned.prefill_tokens_per_s <= 1e7
    assert learned.overhead_s >= 0.0


# Predicted TPOT


@pytest.mark.parametrize(
    ("snap", "inflight", "since", "stale", "batch"),
    [(snapshot(running=10, waiting=0), 0, 0, False, 11),
     (snapshot(running=10, waiting=5), 0, 0, False, 16),
     (snapshot(running=10, waiting=5), 3, 3, False, 19),
     (snapshot(running=10, waiting=5), 7, 0, True, 8)],
    ids=["running plus this one", "the waiting queue decodes alongside too",
         "so do requests dispatched since the scrape",
         "a stale snapshot: the gateway's in-flight count plus this one"],
)
def test_predicted_tpot_is_the_decode_step_with_everything_there_plus_this_request(
    snap: BackendSnapshot, inflight: int, since: int, stale: bool, batch: int
) -> None:
    pred = run(backend(snap, inflight=inflight, since=since, stale=stale))
    assert pred.tpot_batch == batch
    assert pred.predicted_tpot_s == pytest.approx(PROFILE.decode_step_s(batch))
    assert pred.tpot_before_s == pytest.approx(PROFILE.decode_step_s(batch - 1))


@pytest.mark.parametrize(
    ("load", "own", "busy_before", "busy_after"),
    [(0.0, 0.0, 0.0, 0.0), (5_000.0, 0.0, 0.5, 0.5), (5_000.0, 2_500.0, 0.5, 0.75),
     (50_000.0, 0.0, MAX_PREFILL_BUSY, MAX_PREFILL_BUSY)],
    ids=["no prefill load: the bare decode step",
         "prefills taking half the time double the TPOT",
         "this request's own prompt adds to the load the others see",
         "a saturated backend is capped, not infinite"],
)
def test_interleaved_prefills_stretch_the_predicted_tpot(
    load: float, own: float, busy_before: float, busy_after: float
) -> None:
    # PROFILE prefills 10,000 tokens/s.
    snap = snapshot(running=20)
    pred = predict(backend(snap), cost(), 0, PROFILE, prefill_tokens_per_s=load,
                   own_prefill_tokens_per_s=own)
    assert pred.prefill_busy == pytest.approx(busy_before)
    assert pred.tpot_before_s == pytest.approx(PROFILE.decode_step_s(20) / (1 - busy_before))
    assert pred.predicted_tpot_s == pytest.approx(PROFILE.decode_step_s(21) / (1 - busy_after))


def test_prefill_rate_is_tokens_per_second_decaying_with_its_time_constant() -> None:
    rate = PrefillRate(tau_s=2.0)
    assert rate.rate(0.0) == 0.0
    rate.add(4_000, 0.0)
    assert rate.rate(0.0) == pytest.approx(2_000.0)
    assert rate.rate(0.0, extra_tokens=2_000) == pytest.approx(3_000.0)
    assert rate.rate(2.0) == pytest.approx(2_000.0 / math.e)
    assert rate.rate(1.0) == pytest.approx(2_000.0 / math.e)  # time never goes backwards
    with pytest.raises(ValueError):
        PrefillRate(tau_s=0.0)
