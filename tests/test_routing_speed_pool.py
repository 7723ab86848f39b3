"""Learned speeds that converge and stay put: a backend's own estimate is robust (the median of
its recent readings), its confidence grows with its readings, and the scale a policy reads is
shrunk toward its class's pooled estimate, within a band its confidence sets."""

from __future__ import annotations

import math
import random

import pytest

from routing.dispatch import (
    Completion,
    Dispatch,
    DispatchConfig,
    Dispatcher,
    Job,
    Rejection,
    Waiting,
)
from routing.fleet import Fleet
from routing.policies import PolicyContext, build_router
from routing.speed import ProfileEstimator
from routing.speed_pool import (
    CLASS_TOLERANCE,
    MAX_CLASS_SPREAD,
    SHRINK_READINGS,
    PoolParams,
    SpeedClasses,
    class_log_scale,
    confidence,
    pooled_log_scales,
    speed_class,
)
from routing.state import BackendSnapshot, BackendSpec, Candidate
from routing.ttft import SLOW_START_SCALE, BackendProfile

PROFILE = BackendProfile(10_000.0, 0.005, 0.01, 1e-7)
PARAMS = PoolParams()
KV = 10_000.0  # KV tokens each test reply's decode steps read


def tpot_at(scale: float) -> float:
    """The TPOT of a reply reading `KV` tokens, with no prefill load, on a backend `scale`
    times slower than PROFILE."""
    return PROFILE.decode_step_s(KV) * scale


def fed(ratios: list[float]) -> ProfileEstimator:
    est = ProfileEstimator(PROFILE)
    for r in ratios:
        est.observe_tpot(KV, 0.0, tpot_at(r))
    return est


def classmates(*histories: list[float]) -> list[float]:
    """The scales a policy reads for backends of one class, each fed its own history."""
    readings = [fed(h).reading for h in histories]
    return [math.exp(x) for x in pooled_log_scales(readings, PARAMS)]


def pool_of(*histories: list[float]) -> float:
    """Their class's pooled estimate, as a scale."""
    return math.exp(class_log_scale([fed(h).reading for h in histories], PARAMS))


# Confidence: n / (n + shrink).

@pytest.mark.parametrize(
    ("readings", "expected"),
    [(0, 0.0), (1, 1 / 201), (200, 0.5), (600, 0.75), (20_000, 20_000 / 20_200)],
    ids=["none: the class's alone", "one reply: a two-hundredth of a weight",
         "as many as the shrink: half", "three times the shrink: three quarters",
         "many: nearly its own"],
)
def test_confidence_grows_with_readings(readings: int, expected: float) -> None:
    assert SHRINK_READINGS == 200.0
    assert confidence(readings, PARAMS) == pytest.approx(expected)
    est = fed([1.0] * readings)
    assert est.confidence == pytest.approx(expected)


# One outlier does not move a scale past its band.

@pytest.mark.parametrize(
    ("own_before", "outlier"),
    [(0, 20.0), (0, 0.05), (40, 20.0), (40, 0.05)],
    ids=["a fresh backend's first reply 20x slow", "a fresh backend's first reply 20x fast",
         "a measured backend's one reply 20x slow", "a measured backend's one reply 20x fast"],
)
def test_one_outlier_reply_stays_within_its_band(own_before: int, outlier: float) -> None:
    siblings = [1.0] * 40
    own = [1.0] * own_before + [outlier]
    scale = classmates(own, siblings, siblings)[0]
    pooled = pool_of(own, siblings, siblings)
    band = math.exp(confidence(own_before + 1, PARAMS) * math.log(MAX_CLASS_SPREAD))
    assert pooled / band <= scale <= pooled * band
    assert scale == pytest.approx(1.0, rel=0.15)  # within 15% of its siblings' speed


def test_a_median_ignores_a_minority_of_outliers_that_a_mean_would_follow() -> None:
    est = fed([1.0] * 45 + [20.0] * 19)  # nearly a third of the window 20x slow
    assert est.own_scale == pytest.approx(1.0)


# Shrinkage toward the class.

@pytest.mark.parametrize(
    ("own", "expected"),
    [(1, 1.005), (200, 1.59), (20_000, 1.99)],
    ids=["one reply: nearly the class's", "as many as the shrink: halfway to its own",
         "many: nearly its own"],
)
def test_a_backend_is_shrunk_toward_its_class_until_it_has_enough_replies(
    own: int, expected: float
) -> None:
    # Two siblings read 1.0 from 200 replies each; this one reads 2.0 from its own. (Their
    # class's pooled estimate, 2^(1/3) = 1.26 with as many replies each, is what it moves from.)
    scales = classmates([2.0] * own, [1.0] * 200, [1.0] * 200)
    assert scales[0] == pytest.approx(expected, rel=0.03)


def test_a_backend_far_off_its_class_reads_at_most_the_largest_spread_from_its_pool() -> None:
    slow, fast = [50.0] * 5000, [1.0] * 5000
    scales, pooled = classmates(slow, fast), pool_of(slow, fast)
    assert 0.9 * pooled * MAX_CLASS_SPREAD < scales[0] <= pooled * MAX_CLASS_SPREAD
    assert pooled / MAX_CLASS_SPREAD <= scales[1] < pooled / MAX_CLASS_SPREAD / 0.9


@pytest.mark.parametrize("seed", range(3))
def test_members_that_really_differ_keep_what_their_replies_show(seed: int) -> None:
    # Two cards of equal memory, one 1.6x slower, replies scattered by e^0.1: one class by
    # their scrapes, two speeds once they have 5,000 replies each.
    rng = random.Random(seed)
    scales = classmates([rng.lognormvariate(0.0, 0.1) for _ in range(5000)],
                        [1.6 * rng.lognormvariate(0.0, 0.1) for _ in range(5000)])
    assert scales[1] / scales[0] == pytest.approx(1.6, rel=0.1)


def test_a_class_nobody_measured_reads_as_the_slow_start() -> None:
    assert classmates([], []) == pytest.approx([SLOW_START_SCALE] * 2)


def test_an_unmeasured_member_reads_as_its_measured_class() -> None:
    scales = classmates([], [1.5] * 100, [1.5] * 100)
    assert scales[0] == pytest.approx(1.5, rel=0.01)


# Identical backends read alike.

@pytest.mark.parametrize("offset", [1.0, 1.05, 1.1, 0.9])
def test_members_deviating_within_the_tolerance_read_their_class_exactly(offset: float) -> None:
    # However many replies: a few percent of speed would otherwise tilt a whole burst.
    scales = classmates([offset] * 5000, [1.0] * 5000, [1.0] * 5000)
    assert scales[0] == scales[1] == scales[2]
    assert CLASS_TOLERANCE == 1.15

def test_identical_streams_give_identical_scales() -> None:
    history = [random.Random(3).lognormvariate(0.0, 0.5) for _ in range(100)]
    a, b, c = classmates(history, history, history)
    assert a == b == c


@pytest.mark.parametrize("seed", range(5))
def test_identical_backends_with_noisy_replies_read_within_15_percent(seed: int) -> None:
    # Each reply's time scattered by a factor of e^0.4 around the truth (1.3), one in ten a
    # host's hiccup 5x slow: 64 replies each.
    rng = random.Random(seed)

    def replies() -> list[float]:
        return [1.3 * rng.lognormvariate(0.0, 0.4) * (5.0 if rng.random() < 0.1 else 1.0)
                for _ in range(64)]

    scales = classmates(replies(), replies(), replies())
    assert max(scales) / min(scales) < 1.15


# Classes: who pools with whom.

def cand(backend: str, *, total: int | None = 1000, models: tuple[str, ...] = ("m",),
         fmt: str = "vllm", scraped: bool = True) -> Candidate:
    snap = BackendSnapshot(taken_at=0.0, format=fmt, kv_total_blocks=total, kv_free_blocks=total,
                           block_size=16, running=0, waiting=0) if scraped else None
    return Candidate(BackendSpec(backend, f"http://127.0.0.1/{backend}", models), True, snap,
                     not scraped, 0, 0)


@pytest.mark.parametrize(
    ("other", "same"),
    [(cand("b"), True), (cand("b", total=900), False), (cand("b", models=("n",)), False),
     (cand("b", fmt="sglang"), False), (cand("b", scraped=False), False)],
    ids=["same engine, models and KV: one class", "other KV capacity: another class",
         "other models: another class", "other engine: another class",
         "not scraped yet: another class"],
)
def test_speed_classes(other: Candidate, same: bool) -> None:
    assert (speed_class(cand("a")) == speed_class(other)) is same


def test_a_backend_that_changes_class_leaves_its_old_siblings() -> None:
    classes = SpeedClasses()
    for b in ("a", "b", "c"):
        assert classes.assign(b, "x") == (True, None)
    assert classes.assign("a", "x") == (False, None)
    assert classes.assign("c", "y") == (True, "x")
    assert classes.siblings("a") == ("a", "b")
    assert classes.siblings("c") == ("c",)
    assert classes.siblings("unknown") == ("unknown",)


# In the Dispatcher: the class is read from the candidates it dispatched to.

def make_fleet(**totals: int) -> Fleet:
    fleet = Fleet([BackendSpec(b, f"http://127.0.0.1/{b}", ("m",)) for b in totals],
                  max_snapshot_age=100.0)
    for b, total in totals.items():
        fleet.record_scrape(b, BackendSnapshot(
            taken_at=0.0, format="vllm", kv_total_blocks=total, kv_free_blocks=total,
            block_size=16, running=0, waiting=0))
    return fleet


def placed(out: Dispatch | Waiting | Rejection) -> Dispatch:
    assert isinstance(out, Dispatch), out
    return out


def streamed(name: str) -> Job:
    return Job(name, "m", "hello " * 20, max_tokens=64, stream=True)


@pytest.mark.parametrize(
    ("totals", "pooled"),
    [({"a": 100_000, "b": 100_000, "c": 100_000}, True),
     ({"a": 100_000, "b": 99_000, "c": 98_000}, False)],
    ids=["three of one class: a late first token barely moves b",
         "three classes: b alone reads its late first token"],
)
def test_a_cold_start_outlier_moves_a_split_only_as_far_as_its_class_allows(
    totals: dict[str, int], pooled: bool
) -> None:
    d = Dispatcher(make_fleet(**totals), build_router("cost", PolicyContext(rng=random.Random(0))),
                   config=DispatchConfig())
    fast = Completion(completion_tokens=100, ttft_s=0.02, tpot_s=0.008)
    # A cold start, one request each; b's first token comes a second late, 20x and more its
    # prediction, though its reply is as fast as the others'.
    outs = [placed(d.submit(streamed(f"r{i}"), 0.0)) for i in range(3)]
    assert {o.backend_id for o in outs} == set(totals)
    for out in outs:
        d.first_token(out, 1.0 if out.backend_id == "b" else 0.02)
        d.finish(out, 1.5, fast)
    scales = {b: d.learned_speed(b)[0] for b in totals}
    assert all(s is not None for s in scales.values())
    spread = (scales["b"] or 0.0) / (scales["a"] or 1.0)
    if pooled:
        assert spread < 1.15
    else:
        assert spread > 2.0


def test_a_class_reads_one_speed_while_only_one_member_reports_replies() -> None:
    d = Dispatcher(make_fleet(a=100_000, b=100_000, c=100_000),
                   build_router("cost", PolicyContext(rng=random.Random(0))),
                   config=DispatchConfig())
    fast = Completion(completion_tokens=100, ttft_s=0.02, tpot_s=0.008)
    reported = 0
    for i in range(60):
        out = placed(d.submit(streamed(f"r{i}"), float(i)))
        learns = out.backend_id == "b"
        reported += learns
        d.finish(out, float(i) + 0.5, fast if learns else None)
    assert reported >= 8
    assert d.learned_speed("a") == (None, 0)  # a's own speed was never measured
    # a and c read b's speed as their class's, exactly: alike backends, alike predictions.
    assert d.profile("a") == d.profile("b") == d.profile("c")
    scale_b = d.learned_speed("b")[0]
    assert scale_b is not None and scale_b < SLOW_START_SCALE / 2  # its fast replies showed
