"""The censoring-aware reply-length estimate: a reply cut at its max_tokens says its natural
length is at least that, never that it ended there."""

from __future__ import annotations

import math
import random

import pytest

from routing.output_length import REFRESH_EVERY, WARM_UP, LengthHistogram


def hist(ended: list[int] = (), cut: list[int] = (), *,  # type: ignore[assignment]
         prior_weight: float = 4.0) -> LengthHistogram:
    h = LengthHistogram(half_life=500.0, prior_median=256.0, prior_weight=prior_weight)
    for n in ended:
        h.observe(n)
    for n in cut:
        h.observe(n, censored=True)
    return h


@pytest.mark.parametrize(
    ("ended", "cut"),
    [([], [32] * 6), ([20] * 50, [32] * 6), ([300] * 200, [64] * 500), ([], [1500] * 2000),
     ([40, 400, 4000] * 100, [1024] * 300)],
    ids=["six-cut-short-on-the-prior", "after-short-ended-replies", "mostly-cut-below-the-typical",
         "all-cut-long", "cut-amid-a-wide-spread"],
)
def test_replies_all_cut_at_a_length_keep_every_quantile_at_or_above_it(
    ended: list[int], cut: list[int]
) -> None:
    h = hist(ended, cut)
    length = cut[0]
    fraction_ended_before = sum(1 for n in ended if n < length) / (len(ended) + len(cut))
    for q in (0.5, 0.9, 0.99):
        if q > fraction_ended_before + 0.05:  # beyond the ended replies shorter than the cut
            assert h.quantile(q) >= length, q


@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"history-{s}")
@pytest.mark.parametrize("cut", [8, 32, 200, 1500], ids=lambda c: f"cut-at-{c}")
def test_a_censored_reply_never_lowers_a_quantile(seed: int, cut: int) -> None:
    rng = random.Random(seed)
    h = hist()
    for _ in range(rng.randint(0, 300)):
        h.observe(max(1, round(math.exp(rng.gauss(5.0, 1.2)))), censored=rng.random() < 0.3)
    before = [h.quantile(q) for q in (0.1, 0.5, 0.9, 0.99)]
    h.observe(cut, censored=True)
    after = [h.quantile(q) for q in (0.1, 0.5, 0.9, 0.99)]
    assert all(a >= b * (1 - 1e-9) for a, b in zip(after, before, strict=True))


def test_cut_replies_are_not_learned_as_their_cut_length() -> None:
    # Six replies cut at 32 tokens: counted as samples they would pull the reservation of a
    # 1,500-token request down towards 32; as censored ones it stays with the prior's tail.
    sampled, censored, prior = (hist(ended=[32] * 6).stats(1500), hist(cut=[32] * 6).stats(1500),
                                hist().stats(1500))
    assert sampled.p50 < 64 and sampled.reserve < prior.reserve
    assert censored.reserve >= prior.reserve
    assert censored.p50 >= prior.p50


@pytest.mark.parametrize(
    ("reached", "q"),
    [(1, 0.9), (100, 0.5), (100, 0.9), (2000, 0.9), (50_000, 0.9)],
    ids=["from-the-start", "median-past-100", "p90-past-100", "past-the-typical",
         "past-everything-seen"],
)
def test_the_quantile_given_a_reached_length_is_never_below_it(reached: int, q: float) -> None:
    h = hist(ended=[50, 200, 800] * 300)
    ahead = h.quantile_from(q, reached)
    assert ahead >= reached
    assert ahead >= h.quantile_from(q, max(1, reached // 2))  # longer so far, longer ahead


def test_the_quantile_from_the_start_is_the_plain_quantile() -> None:
    h = hist(ended=[50, 200, 800] * 300)
    assert h.quantile_from(0.9, 0) == pytest.approx(h.quantile(0.9))


@pytest.mark.parametrize(
    ("max_tokens", "min_tokens"),
    [(16, 0), (300, 0), (5000, 0), (None, 0), (300, 100), (300, 300), (300, 900)],
    ids=["tiny-cap", "cap-inside", "cap-past-the-tail", "no-cap", "floor-below-cap",
         "floor-at-cap", "floor-past-cap-is-the-cap"],
)
def test_every_figure_stays_within_the_requests_floor_and_cap(
    max_tokens: int | None, min_tokens: int
) -> None:
    s = hist(ended=[20, 200, 2000] * 200, cut=[500] * 100).stats(max_tokens, min_tokens)
    cap = math.inf if max_tokens is None else max_tokens
    floor = min(min_tokens, cap)
    for figure in (s.p50, s.p90, s.reserve, s.mean):
        assert floor - 1e-9 <= figure <= cap
    assert s.p50 <= s.p90 <= max(s.reserve, s.p90)
    if floor == cap:
        assert (s.p50, s.reserve, s.mean, s.var) == (cap, cap, cap, 0.0)


def test_without_censoring_the_estimate_is_the_histogram() -> None:
    rng = random.Random(4)
    lengths = [max(1, round(math.exp(rng.gauss(5.0, 0.8)))) for _ in range(3000)]
    h = hist(ended=lengths, prior_weight=1e-9)
    recent = sorted(lengths[-1000:])
    assert h.quantile(0.5) == pytest.approx(recent[500], rel=0.12)
    assert h.quantile(0.9) == pytest.approx(recent[900], rel=0.12)


def test_the_reservation_quantile_is_the_configured_one() -> None:
    lengths = [50, 200, 800] * 300
    low = LengthHistogram(half_life=500.0, prior_median=256.0, prior_weight=4.0,
                          reservation_quantile=0.5)
    high = LengthHistogram(half_life=500.0, prior_median=256.0, prior_weight=4.0,
                           reservation_quantile=0.99)
    for n in lengths:
        low.observe(n)
        high.observe(n)
    assert low.stats(None).reserve == low.stats(None).p50
    assert high.stats(None).reserve > high.stats(None).p90


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, 1.5], ids=["zero", "one", "negative", "over-one"])
def test_a_reservation_quantile_outside_zero_one_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="quantile"):
        LengthHistogram(half_life=1.0, prior_median=1.0, prior_weight=1.0,
                        reservation_quantile=q)


def test_the_estimate_follows_every_reply_while_young_then_every_few() -> None:
    h = hist(prior_weight=1e-9)
    for _ in range(WARM_UP):  # young: each reply shows at once
        before = h.quantile(0.99)
        h.observe(5000)
        assert h.quantile(0.99) > before or before >= 4000
    h = hist(ended=[100] * WARM_UP, prior_weight=1e-9)
    steady = h.quantile(0.99)
    shown = []
    for _ in range(REFRESH_EVERY):
        h.observe(60_000)
        shown.append(h.quantile(0.99) != steady)
    assert shown == [False] * (REFRESH_EVERY - 1) + [True]  # seen within REFRESH_EVERY replies
