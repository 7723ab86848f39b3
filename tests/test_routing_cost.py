"""Cost estimate: prompt tokens (calibrated or exact), the learned output-length distribution and
the KV blocks a request holds."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from routing.cost import DEFAULT_OUTPUT_MEDIAN, CostModel, RequestCost

MODEL = "llama-3-8b"


class WordTokenizer:
    """An exact tokenizer for tests: one token per whitespace-separated word."""

    def count(self, text: str) -> int:
        return len(text.split())


def lognormal(rng: random.Random, median: float, sigma: float) -> int:
    return max(1, round(math.exp(rng.gauss(math.log(median), sigma))))


def empirical(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def learned(samples: list[int], *, prior_weight: float = 4.0) -> CostModel:
    model = CostModel(prior_weight=prior_weight)
    cost = model.estimate(MODEL, "x", None)
    for n in samples:
        model.observe(cost, prompt_tokens=None, completion_tokens=n)
    return model


@pytest.mark.parametrize(
    ("chars", "tokens"),
    [(1, 1), (4, 1), (5, 2), (400, 100), (4001, 1001), (0, 1)],
    ids=["one-char", "one-token", "rounds-up", "hundred", "rounds-up-large", "empty-is-one"],
)
def test_uncalibrated_prompt_estimate_is_four_chars_per_token(chars: int, tokens: int) -> None:
    cost = CostModel().estimate(MODEL, "a" * chars, None)
    assert (cost.prompt_tokens, cost.exact, cost.prompt_chars) == (tokens, False, chars)


@pytest.mark.parametrize("ratio", [0.2, 0.3, 0.55], ids=["5-chars", "3.3-chars", "code-like"])
def test_calibration_converges_to_the_reported_tokens_per_char_ratio(ratio: float) -> None:
    model = CostModel()
    rng = random.Random(3)
    for _ in range(1500):
        text = "w" * rng.randint(200, 8000)
        cost = model.estimate(MODEL, text, None)
        model.observe(cost, prompt_tokens=round(len(text) * ratio), completion_tokens=None)
    assert model.tokens_per_char(MODEL) == pytest.approx(ratio, rel=0.01)
    assert model.estimate(MODEL, "w" * 10_000, None).prompt_tokens == pytest.approx(
        10_000 * ratio, rel=0.01
    )


def test_calibration_is_per_model() -> None:
    model = CostModel()
    cost = model.estimate("a", "x" * 1000, None)
    for _ in range(500):
        model.observe(cost, prompt_tokens=500, completion_tokens=None)
    assert model.tokens_per_char("a") == pytest.approx(0.5, rel=0.01)
    assert model.tokens_per_char("b") == 0.25


def test_typical_prompt_tracks_reported_prompt_sizes() -> None:
    model = CostModel()
    cost = model.estimate(MODEL, "x" * 100, None)
    assert cost.typical_prompt_tokens == 512
    for _ in range(2000):
        model.observe(cost, prompt_tokens=3000, completion_tokens=None)
    assert model.estimate(MODEL, "x", None).typical_prompt_tokens == pytest.approx(3000, rel=0.01)


def test_configured_tokenizer_counts_exactly_and_only_for_its_model() -> None:
    model = CostModel(tokenizers={MODEL: WordTokenizer()})
    text = "the quick brown fox jumps"
    assert (model.estimate(MODEL, text, None).prompt_tokens,
            model.estimate(MODEL, text, None).exact) == (5, True)
    other = model.estimate("other", text, None)
    assert (other.prompt_tokens, other.exact) == (math.ceil(len(text) / 4), False)


def test_missing_usage_figures_teach_nothing() -> None:
    model = CostModel()
    before = model.estimate(MODEL, "x" * 400, 100)
    for _ in range(50):
        model.observe(before, prompt_tokens=None, completion_tokens=None)
    assert model.estimate(MODEL, "x" * 400, 100) == before


def test_before_any_reply_the_output_prior_is_centred_on_its_median() -> None:
    cost = CostModel().estimate(MODEL, "hi", None)
    assert cost.output_p50 == pytest.approx(DEFAULT_OUTPUT_MEDIAN, rel=0.1)
    assert cost.output_p90 > 2 * cost.output_p50  # wide: one sigma in log space


@pytest.mark.parametrize(
    ("median", "sigma"),
    [(40, 0.4), (200, 1.0), (1500, 0.7)],
    ids=["short-chat", "heavy-tailed", "long-form"],
)
def test_learned_output_distribution_tracks_observed_p50_and_p90(
    median: float, sigma: float
) -> None:
    rng = random.Random(11)
    samples = [lognormal(rng, median, sigma) for _ in range(4000)]
    model = learned(samples)
    recent = samples[-1500:]  # the decay (half-life 500 replies) forgets older ones
    cost = model.estimate(MODEL, "hi", None)
    assert cost.output_p50 == pytest.approx(empirical(recent, 0.5), rel=0.1)
    assert cost.output_p90 == pytest.approx(empirical(recent, 0.9), rel=0.1)
    assert cost.output_mean == pytest.approx(sum(recent) / len(recent), rel=0.1)


def test_the_distribution_follows_a_drifting_workload() -> None:
    model = learned([100] * 3000 + [1000] * 3000)
    assert model.estimate(MODEL, "hi", None).output_p50 == pytest.approx(1000, rel=0.1)


@pytest.mark.parametrize(
    ("max_tokens", "p50", "p90"),
    [(50, 50, 50), (300, 200, 300), (None, 200, 800)],
    ids=["cap-below-median", "cap-between", "no-cap"],
)
def test_max_tokens_bounds_the_expected_output(
    max_tokens: int | None, p50: int, p90: int
) -> None:
    model = learned([200] * 800 + [800] * 200, prior_weight=1e-9)  # p50 200, p90 800
    cost = model.estimate(MODEL, "hi", max_tokens)
    assert cost.output_p50 == pytest.approx(p50, rel=0.1)
    assert cost.output_p90 == pytest.approx(p90, rel=0.1)
    assert cost.output_mean <= (max_tokens or math.inf)


def test_inflight_growth_matches_a_simulation_of_running_sequences() -> None:
    # Two kinds of replies: short and long, equally frequent. A sequence found running is
    # length-biased and uniformly far into its reply; it grows by min(remaining, horizon).
    model = learned([50, 1000] * 2000, prior_weight=1e-9)
    cost = model.estimate(MODEL, "hi", 200)
    horizon = max(cost.output_p90, math.ceil(cost.output_mean))
    rng = random.Random(2)
    # Each length counts at its bucket's geometric centre: 50 in [2^5.5, 2^5.75), 1000 in
    # [2^9.75, 2^10).
    reps = {50: 2**5.625, 1000: 2**9.875}
    draws = []
    for _ in range(100_000):
        length = reps[50] if rng.random() < reps[50] / (reps[50] + reps[1000]) else reps[1000]
        draws.append(min(length * rng.random(), horizon))
    mean = sum(draws) / len(draws)
    var = sum((d - mean) ** 2 for d in draws) / len(draws)
    assert cost.inflight_growth_mean == pytest.approx(mean, rel=0.02)
    assert cost.inflight_growth_var == pytest.approx(var, rel=0.05)


def make_cost(prompt: int, mean: float, p90: int) -> RequestCost:
    return RequestCost(
        model=MODEL, prompt_chars=4 * prompt, prompt_tokens=prompt, exact=False,
        tokens_per_char=0.25, max_tokens=None, output_p50=p90 // 2, output_p90=p90,
        output_mean=mean, output_var=0.0, typical_prompt_tokens=512.0, mean_output_all=mean,
        inflight_growth_mean=0.0, inflight_growth_var=0.0,
    )


@pytest.mark.parametrize(
    ("prompt", "mean", "p90", "block_size", "peak", "reserve"),
    [
        (100, 28.0, 60, 16, 8, 10),  # (100+28)/16 = 8 exactly; (100+60)/16 = 10
        (100, 28.2, 60, 16, 9, 10),  # a partial block is a whole block
        (1, 0.0, 0, 16, 1, 1),
        (1000, 500.0, 400, 1, 1500, 1500),  # token-granular; reserve never below the mean
    ],
    ids=["exact-blocks", "partial-block-rounds-up", "tiny", "heavy-tail-mean-above-p90"],
)
def test_peak_and_reserved_blocks(
    prompt: int, mean: float, p90: int, block_size: int, peak: int, reserve: int
) -> None:
    cost = make_cost(prompt, mean, p90)
    assert (cost.peak_blocks(block_size), cost.reserve_blocks(block_size)) == (peak, reserve)


@pytest.mark.parametrize(
    ("chars", "tokens"), [(0, 0), (400, 100), (10_000, 1000)],
    ids=["none", "part", "capped-at-the-prompt"],
)
def test_prefix_tokens_convert_cached_chars_and_never_exceed_the_prompt(
    chars: int, tokens: int
) -> None:
    assert make_cost(1000, 10.0, 20).prefix_tokens(chars) == tokens


@pytest.mark.parametrize(
    "make",
    [
        lambda: CostModel(chars_per_token=0.0),
        lambda: CostModel(prompt_half_life=-1.0),
        lambda: CostModel(output_half_life=0.0),
        lambda: CostModel(output_prior_median=0.0),
        lambda: CostModel(prior_weight=0.0),
    ],
    ids=["ratio", "prompt-half-life", "output-half-life", "prior-median", "prior-weight"],
)
def test_a_cost_model_with_a_non_positive_figure_is_refused_at_construction(
    make: Callable[[], CostModel]
) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        make()
