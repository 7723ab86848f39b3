"""TTFT and preemption-risk prediction for one request on one candidate backend, and the online
per-backend speed profile."""

from __future__ import annotations

import math
import random

import pytest

from routing.backend_work import BackendWork, PrefillRate
from routing.cost import RequestCost
from routing.predict import predict
from routing.speed import ProfileEstimator
from routing.state import BackendSnapshot, BackendSpec, Candidate
from routing.ttft import (
    BOOTSTRAP_TPOTS,
    MAX_PREFILL_BUSY,
    SLOW_START_SCALE,
    UNKNOWN_RISK,
    BackendProfile,
    Prediction,
)

PROFILE = BackendProfile(prefill_tokens_per_s=10_000.0, overhead_s=0.005, decode_base_s=0.01,
                         decode_per_kv_token_s=1e-7)
PER_SEQ = 1000 + 160 / 2  # context of a sequence nobody recorded: typical prompt + half a reply
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
    step = PROFILE.decode_step_s(running * PER_SEQ)
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


def test_a_backend_not_measured_yet_is_taken_as_slow_until_its_replies_prove_otherwise() -> None:
    est = ProfileEstimator(PROFILE)
    assert est.scale == pytest.approx(SLOW_START_SCALE)
    assert est.profile().prefill_tokens_per_s == pytest.approx(10_000.0 / SLOW_START_SCALE)
    assert est.profile().decode_base_s == pytest.approx(0.01 * SLOW_START_SCALE)


def tpot_of(truth: BackendProfile, kv: float, load: float) -> float:
    """A reply's TPOT on a backend of profile `truth` (the module's step model)."""
    return truth.decode_step_s(kv) / (1.0 - load / truth.prefill_tokens_per_s)


@pytest.mark.parametrize(
    "scale", [1.0, 3.0, 0.5], ids=["as the prior", "three times slower", "twice as fast"])
def test_profile_estimator_learns_the_backends_speed_relative_to_the_prior_from_tpots(
    scale: float
) -> None:
    truth = BackendProfile(PROFILE.prefill_tokens_per_s / scale, PROFILE.overhead_s,
                           PROFILE.decode_base_s * scale, PROFILE.decode_per_kv_token_s * scale)
    est = ProfileEstimator(PROFILE)
    rng = random.Random(4)
    for _ in range(1000):
        kv, load = rng.uniform(0, 200_000), rng.uniform(0, 0.6) * truth.prefill_tokens_per_s
        est.observe_tpot(kv, load, tpot_of(truth, kv, load) * rng.uniform(0.9, 1.1))
    assert est.scale == pytest.approx(scale, rel=0.05)
    assert est.profile().prefill_tokens_per_s == pytest.approx(truth.prefill_tokens_per_s,
                                                               rel=0.05)


def test_a_few_replies_under_heavy_prefill_do_not_set_the_speed_for_every_other() -> None:
    # 90 light replies run at the prior's speed; 10 ran under heavy prefill, where the model
    # is least exact, 3x slower than it says. The speed is the typical reply's: the median, 1.
    # A least-squares ratio would give 2.9, weighing each reply by its modelled time squared.
    est = ProfileEstimator(PROFILE, initial_scale=1.0)
    heavy_load = 0.2 * PROFILE.prefill_tokens_per_s
    for i in range(100):
        if i % 10:
            est.observe_tpot(10_000.0, 0.0, tpot_of(PROFILE, 10_000.0, 0.0))
        else:
            est.observe_tpot(200_000.0, heavy_load, tpot_of(scaled(3.0), 200_000.0, heavy_load))
    assert est.scale == pytest.approx(1.0, rel=0.03)


def test_queueing_inside_the_engine_never_reads_as_slow_prefill() -> None:
    # Speed is learned from TPOTs, which a queue ahead does not lengthen.
    est = ProfileEstimator(PROFILE, initial_scale=1.0)
    for _ in range(100):
        est.observe_tpot(50_000.0, 0.0, tpot_of(PROFILE, 50_000.0, 0.0))
    assert est.profile().prefill_tokens_per_s == pytest.approx(10_000.0, rel=1e-6)


def scaled(scale: float) -> BackendProfile:
    """The prior profile run `scale` times slower."""
    return BackendProfile(PROFILE.prefill_tokens_per_s / scale, PROFILE.overhead_s,
                          PROFILE.decode_base_s * scale, PROFILE.decode_per_kv_token_s * scale)


@pytest.mark.parametrize("truth", [1.0, 2.0], ids=["as fast as the prior", "twice slower"])
def test_first_tokens_calibrate_a_new_backend_before_any_reply_ends(truth: float) -> None:
    est = ProfileEstimator(PROFILE)
    request = backend(snapshot(running=4))
    for _ in range(BOOTSTRAP_TPOTS):
        pred = predict(request, cost(), 0, est.profile())
        est.observe_ttft(pred, predict(request, cost(), 0, scaled(truth)).predicted_ttft_s)
    # From the slow start (4x) to within 10% of the truth, with no reply finished.
    assert est.scale == pytest.approx(truth, rel=0.1)


def test_once_replies_show_the_speed_ttfts_no_longer_count() -> None:
    est = ProfileEstimator(PROFILE, initial_scale=1.0)
    for _ in range(BOOTSTRAP_TPOTS):
        est.observe_tpot(50_000.0, 0.0, tpot_of(PROFILE, 50_000.0, 0.0))
    before = est.scale
    queued = predict(backend(snapshot()), cost(), 0, est.profile())
    est.observe_ttft(queued, 10.0)  # a first token 10 s late: queueing, not a slow card
    assert est.scale == before


def test_a_ttft_predicted_with_a_kv_wait_teaches_nothing() -> None:
    est = ProfileEstimator(PROFILE)
    full = predict(backend(snapshot(free=50, running=10)), cost(), 0, est.profile())
    assert full.kv_wait_s > 0.0
    est.observe_ttft(full, 0.001)
    assert est.scale == pytest.approx(SLOW_START_SCALE)


def test_nonsense_tpots_keep_the_speed_within_bounds() -> None:
    est = ProfileEstimator(PROFILE)
    for _ in range(1000):
        est.observe_tpot(0.0, 0.0, 1e6)
    assert est.scale == pytest.approx(100.0, rel=1e-2)
    est.observe_tpot(0.0, 0.0, 0.0)  # no reply time: ignored
    assert est.scale == pytest.approx(100.0, rel=1e-2)


@pytest.mark.parametrize("seconds", [math.inf, math.nan, -1.0], ids=["inf", "nan", "negative"])
def test_a_tpot_that_is_not_a_time_teaches_nothing(seconds: float) -> None:
    est = ProfileEstimator(PROFILE, initial_scale=2.0)
    est.observe_tpot(10_000.0, 0.0, seconds)
    est.observe_tpot(10_000.0, 0.0, tpot_of(PROFILE, 10_000.0, 0.0))
    assert 1.0 < est.scale < 2.0  # between the prior and the one real reply


@pytest.mark.parametrize("kwargs", [{"prior_weight": 0.0}, {"initial_scale": 0.0},
                                    {"window": 0}], ids=["weight", "scale", "window"])
def test_profile_estimator_refuses_a_prior_that_is_not_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ProfileEstimator(PROFILE, **kwargs)


# The gateway's record of the work it sent one backend


def record(*dispatches: tuple[float, int]) -> BackendWork:
    """A backend's record of `(time, uncached tokens)` dispatches, each prefilled at once."""
    work = BackendWork()
    for t, tokens in dispatches:
        work.dispatched(t, tokens, 0.0, tokens_per_s=1e9)
    return work


SENT = ((0.0, 9000), (0.1, 100), (0.2, 200), (0.3, 300), (1.0, 5000))


@pytest.mark.parametrize(
    ("waiting", "tokens_per_s", "queued"),
    [(2, 1e-9, 5500.0), (0, 1e-9, 5000.0), (2, 600.0, 5200.0)],
    ids=["the scrape's 2 waiting are the last 2 sent before it, plus all sent after",
         "nothing waiting at the scrape: only what was sent after it",
         "less what the backend prefilled since the scrape (0.5 s at 600 tokens/s)"],
)
def test_prompts_dispatched_since_the_scrape_count_exactly_and_the_waiting_queue_as_the_last_sent(
    waiting: int, tokens_per_s: float, queued: float
) -> None:
    # Scrape at 0.5; the 5,000-token prompt came at 1.0, after it.
    since, tokens = record(*SENT).queued_tokens(0.5, waiting, 1.0, tokens_per_s)
    assert (since, tokens) == (1, pytest.approx(queued))


def test_a_waiting_queue_longer_than_the_record_counts_at_the_mean_prompt() -> None:
    work = record((0.0, 1000), (0.1, 1000))
    assert work.queued_tokens(0.5, 5, 0.5, 1e-9)[1] == pytest.approx(5000.0)


def test_a_scrape_raises_the_backlog_it_shows_and_the_backend_works_it_off() -> None:
    work = record((0.0, 1000), (0.1, 1000))
    assert work.queued_tokens(0.5, 2, 0.5, 1000.0)[1] == pytest.approx(2000.0)
    assert work.queued_tokens(0.5, 2, 1.5, 1000.0)[1] == pytest.approx(1000.0)
    assert work.queued_tokens(0.5, 2, 9.0, 1000.0)[1] == 0.0


def test_the_fluid_backlog_covers_prompts_a_scrape_shows_running_mid_prefill() -> None:
    work = BackendWork()
    work.dispatched(0.0, 10_000, 0.0, tokens_per_s=1000.0)
    # The scrape at 0.5 saw it running (waiting 0); at 1000 tokens/s 9,000 remain at 1.0.
    assert work.queued_tokens(0.5, 0, 1.0, 1000.0)[1] == pytest.approx(9000.0)
    assert work.backlog(20.0, 1000.0) == 0.0


def test_prompts_sent_since_the_scrape_are_worked_off_from_when_each_was_sent() -> None:
    work = BackendWork()
    for t in (0.05, 0.10, 0.15):  # scrape at 0.0 showed nothing waiting; 1,000 tokens each
        work.dispatched(t, 1000, 0.0, tokens_per_s=10_000.0)
    # At 10,000 tokens/s each takes 0.1 s, so they queue: 2,000 tokens at 0.15, less 500 by
    # 0.2; all done by 0.35.
    assert work.queued_tokens(0.0, 0, 0.2, 10_000.0) == (3, pytest.approx(1500.0))
    assert work.queued_tokens(0.0, 0, 0.4, 10_000.0) == (3, 0.0)


def test_how_long_ago_a_backend_was_scraped_does_not_make_it_look_busier() -> None:
    # Two backends sent the same prompts at the same times, scraped at different instants with
    # nothing waiting: the same queue now. (Counting prompts sent since the scrape in full made
    # the one scraped longer ago look busier, herding requests onto the one just scraped.)
    early, late = BackendWork(), BackendWork()
    for work in (early, late):
        for t in (0.02, 0.06, 0.10, 0.14, 0.18, 0.22):
            work.dispatched(t, 600, 0.0, tokens_per_s=30_000.0)
    scraped_early = early.queued_tokens(0.0, 0, 0.24, 30_000.0)[1]
    scraped_late = late.queued_tokens(0.20, 0, 0.24, 30_000.0)[1]
    assert scraped_early == pytest.approx(scraped_late)


def test_the_context_of_requests_in_flight_is_averaged_until_they_finish() -> None:
    work = BackendWork()
    assert work.context_per_request() is None
    work.dispatched(0.0, 10, 1000.0, tokens_per_s=1e9)
    work.dispatched(0.0, 10, 3000.0, tokens_per_s=1e9)
    assert work.context_per_request() == pytest.approx(2000.0)
    work.finished(1000.0)
    assert work.context_per_request() == pytest.approx(3000.0)
    work.finished(3000.0)
    assert work.context_per_request() is None


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
def test_predicted_tpot_is_the_decode_step_reading_every_sequences_context_plus_this_ones(
    snap: BackendSnapshot, inflight: int, since: int, stale: bool, batch: int
) -> None:
    pred = run(backend(snap, inflight=inflight, since=since, stale=stale))
    others = (batch - 1) * PER_SEQ
    own = 1600 + 160 / 2
    assert pred.tpot_batch == batch
    assert pred.kv_read_tokens == pytest.approx(others + own)
    assert pred.predicted_tpot_s == pytest.approx(PROFILE.decode_step_s(others + own))
    assert pred.tpot_before_s == pytest.approx(PROFILE.decode_step_s(others))


def test_long_contexts_decode_slower_than_short_ones_in_a_batch_of_equal_size() -> None:
    short, long_ = BackendWork(), BackendWork()
    for _ in range(20):
        short.dispatched(0.0, 0, 500.0, tokens_per_s=1e9)
        long_.dispatched(0.0, 0, 8000.0, tokens_per_s=1e9)
    snap = snapshot(running=20)
    fast = predict(backend(snap, inflight=20), cost(), 0, PROFILE, work=short, now=100.0)
    slow = predict(backend(snap, inflight=20), cost(), 0, PROFILE, work=long_, now=100.0)
    assert slow.predicted_tpot_s > fast.predicted_tpot_s
    assert slow.step_s > fast.step_s


@pytest.mark.parametrize(
    ("load", "busy"),
    [(0.0, 0.0), (5_000.0, 0.5), (50_000.0, MAX_PREFILL_BUSY)],
    ids=["no prefill load: the bare decode step",
         "prefills taking half the time double the TPOT",
         "a saturated backend is capped, not infinite"],
)
def test_interleaved_prefills_stretch_the_predicted_tpot(load: float, busy: float) -> None:
    # PROFILE prefills 10,000 tokens/s; the load is what the gateway sent over the last 5 s.
    work = BackendWork(tau_s=5.0)
    if load:
        work.dispatched(100.0, int(load * 5.0), 0.0, tokens_per_s=1e12)
    snap = snapshot(running=20)
    pred = predict(backend(snap), cost(), 0, PROFILE, work=work, now=100.0)
    assert pred.prefill_busy == pytest.approx(busy)
    assert pred.prefill_tokens_per_s == pytest.approx(load)
    assert pred.predicted_tpot_s == pytest.approx(
        PROFILE.decode_step_s(pred.kv_read_tokens) / (1 - busy))


def test_this_prompts_prefill_stalls_the_replies_already_there_once() -> None:
    # 1,600 uncached tokens at 10,000 tokens/s: 0.16 s, over their remaining 160-token replies.
    pred = run(backend(snapshot(running=20)))
    assert pred.tpot_others_s == pytest.approx(pred.predicted_tpot_s + 0.16 / 160)
    cached = run(backend(snapshot(running=20)), cached=1600)
    assert cached.tpot_others_s == pytest.approx(cached.predicted_tpot_s)


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

