"""What one request costs a backend: prompt tokens, output tokens and the KV blocks they hold.

- Prompt tokens come from an injected exact `Tokenizer` when one is configured for the model, else
  from a character count times a tokens-per-character ratio that is calibrated per model, online,
  from the `usage.prompt_tokens` the backends report (chat-template overhead folds into the ratio).
- Output tokens are a distribution, not a single mean: a per-model, fixed-bucket log histogram
  (four buckets per octave, 1 to 131,072 tokens) whose weights decay with every new observation,
  so it follows a drifting workload. It gives quantiles and the moments a routing prediction
  needs, each in O(log buckets) per request (after one O(buckets) refresh of prefix sums per
  batch of new observations), and keeps them per max_tokens until the next observation.
- A request's KV footprint at its peak is `ceil((prompt + expected output) / block_size)` blocks;
  the conservative reservation uses the p90 output instead of the mean.

Learning is counted in observations, not in seconds, so nothing here needs a clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from operator import mul
from typing import NamedTuple, Protocol

DEFAULT_CHARS_PER_TOKEN = 4.0  # English text under BPE tokenizers, and the simulator's rule
DEFAULT_PROMPT_TOKENS = 512.0  # prior for a model's typical prompt, before any usage is reported
DEFAULT_OUTPUT_MEDIAN = 256.0  # prior output length median (lognormal, sigma 1) before any reply

_PER_OCTAVE = 4
_OCTAVES = 17
# Bucket 0 holds empty replies; bucket j >= 1 covers [2**((j-1)/4), 2**(j/4)). Lengths past the top
# edge count in the last bucket: its representative then understates them, which is acceptable for
# replies beyond 100k tokens.
_EDGES: tuple[float, ...] = (0.0,) + tuple(
    2.0 ** (k / _PER_OCTAVE) for k in range(_OCTAVES * _PER_OCTAVE + 1)
)
_BUCKETS = len(_EDGES) - 1
_REPS: tuple[float, ...] = (0.0,) + tuple(
    math.sqrt(_EDGES[j] * _EDGES[j + 1]) for j in range(1, _BUCKETS)
)


class Tokenizer(Protocol):
    """An exact token counter for one model (e.g. backed by the `tokenizers` package)."""

    def count(self, text: str) -> int: ...


def _bucket(tokens: float) -> int:
    if tokens < 1.0:
        return 0
    return min(_BUCKETS - 1, 1 + int(math.log2(tokens) * _PER_OCTAVE))


@dataclass(frozen=True, slots=True)
class RequestCost:
    """One request's estimated cost. Token figures are counts; blocks depend on the backend."""

    model: str
    prompt_chars: int
    prompt_tokens: int
    exact: bool  # prompt_tokens came from a tokenizer, not from the character ratio
    tokens_per_char: float  # the model's calibrated ratio when this estimate was made
    max_tokens: int | None
    output_p50: int  # quantiles of this request's output, bounded by max_tokens
    output_p90: int
    output_mean: float
    output_var: float
    typical_prompt_tokens: float  # the model's recent mean prompt: the size of others' queued work
    mean_output_all: float  # the model's unbounded mean reply: how long a running sequence lives
    # Tokens one sequence already running on a backend is expected to add while this request runs
    # (this request's p90 output, in decode steps), ignoring releases, and their variance.
    inflight_growth_mean: float
    inflight_growth_var: float

    @property
    def peak_tokens(self) -> int:
        return self.prompt_tokens + math.ceil(self.output_mean)

    @property
    def reserve_tokens(self) -> int:
        return self.prompt_tokens + max(self.output_p90, math.ceil(self.output_mean))

    def peak_blocks(self, block_size: int) -> int:
        """KV blocks held at the expected end of the reply: what the gateway's ledger reserves."""
        return -(-self.peak_tokens // block_size)

    def reserve_blocks(self, block_size: int) -> int:
        """KV blocks held if the reply runs to its p90 length: the conservative figure."""
        return -(-self.reserve_tokens // block_size)

    def prompt_blocks(self, block_size: int) -> int:
        return -(-self.prompt_tokens // block_size)

    def prefix_tokens(self, chars: int) -> int:
        """Tokens in the first `chars` characters of the prompt (for a cached prefix)."""
        return min(self.prompt_tokens, int(chars * self.tokens_per_char))


class OutputStats(NamedTuple):
    """A reply-length distribution summarised for one request (token counts). A named tuple:
    one is made per request, and a tuple is built faster than a frozen dataclass."""

    p50: int  # quantiles of min(length, max_tokens)
    p90: int
    mean: float  # moments of min(length, max_tokens)
    var: float
    mean_all: float  # unbounded mean length
    growth_mean: float  # see RequestCost.inflight_growth_mean
    growth_var: float


class LengthHistogram:
    """A decayed log histogram of reply lengths in tokens. One per model; not thread-safe."""

    __slots__ = ("_weights", "_w1", "_w2", "_w3", "_decay", "_increment", "_dirty", "_p0", "_p1",
                 "_p2", "_p3", "_stats")

    def __init__(self, *, half_life: float, prior_median: float, prior_weight: float) -> None:
        """`half_life`: observations after which an old one weighs half. The prior is a lognormal
        (median `prior_median`, sigma 1) worth `prior_weight` observations, decaying like them."""
        if half_life <= 0 or prior_median <= 0 or prior_weight <= 0:
            raise ValueError("half_life, prior_median and prior_weight must be > 0")
        self._decay = 0.5 ** (1.0 / half_life)
        self._increment = 1.0
        mu = math.log(prior_median)
        cdf = [0.5 * math.erfc(-(math.log(e) - mu) / math.sqrt(2.0)) for e in _EDGES[1:]]
        cdf[-1] = 1.0
        lower = [0.0, *cdf[:-1]]
        self._weights = [prior_weight * (c - b) for c, b in zip(cdf, lower, strict=True)]
        self._w1: list[float] = []  # _wk[j] = weight * rep**k of bucket j, kept up to date
        self._w2: list[float] = []
        self._w3: list[float] = []
        self._moments()
        self._dirty = True
        self._p0: list[float] = []  # _pk[b] = sum over buckets j < b of weight * rep**k
        self._p1: list[float] = []
        self._p2: list[float] = []
        self._p3: list[float] = []
        # `stats` by max_tokens since the last observation: a pure function of the weights.
        self._stats: dict[int | None, OutputStats] = {}

    def observe(self, tokens: int) -> None:
        # Decay by growing the weight of each new observation instead of shrinking all the old
        # ones: every figure read out is a ratio of sums, so only relative weights matter.
        self._increment /= self._decay
        j = _bucket(tokens)
        self._weights[j] += self._increment
        if self._increment > 1e100:  # renormalise long before floats overflow
            scale = 1.0 / self._increment
            self._weights = [w * scale for w in self._weights]
            self._increment = 1.0
            self._moments()
        else:  # only bucket j moved: the same products `_moments` would compute
            rep = _REPS[j]
            self._w1[j] = w1 = self._weights[j] * rep
            self._w2[j] = w2 = w1 * rep
            self._w3[j] = w2 * rep
        self._dirty = True
        self._stats.clear()

    def _moments(self) -> None:
        self._w1 = list(map(mul, self._weights, _REPS))
        self._w2 = list(map(mul, self._w1, _REPS))
        self._w3 = list(map(mul, self._w2, _REPS))

    def _sums(self) -> None:
        if not self._dirty:
            return
        self._p0 = list(accumulate(self._weights, initial=0.0))
        self._p1 = list(accumulate(self._w1, initial=0.0))
        self._p2 = list(accumulate(self._w2, initial=0.0))
        self._p3 = list(accumulate(self._w3, initial=0.0))
        self._dirty = False

    def quantile(self, q: float) -> float:
        """The length below which a fraction `q` of replies end (log-interpolated in a bucket)."""
        self._sums()
        cum = self._p0
        target = q * cum[-1]
        j = min(_BUCKETS - 1, max(0, bisect_left(cum, target, 1) - 1))
        if j == 0:
            return 0.0
        w = cum[j + 1] - cum[j]
        frac = min(1.0, max(0.0, (target - cum[j]) / w)) if w > 0 else 0.0
        lo = _EDGES[j]
        return lo * math.pow(_EDGES[j + 1] / lo, frac)

    def stats(self, max_tokens: int | None) -> OutputStats:
        """The figures one request's cost needs, for a reply bounded by `max_tokens`."""
        out = self._stats.get(max_tokens)
        if out is None:
            out = self._stats[max_tokens] = self._compute_stats(max_tokens)
        return out

    def _compute_stats(self, max_tokens: int | None) -> OutputStats:
        self._sums()
        p0, p1, p2, p3 = self._p0, self._p1, self._p2, self._p3
        total, s1 = p0[-1], p1[-1]
        cap = math.inf if max_tokens is None else float(max_tokens)
        p50 = math.ceil(min(self.quantile(0.5), cap))
        p90 = math.ceil(min(self.quantile(0.9), cap))
        b = bisect_right(_REPS, cap)  # buckets below b end before the cap; the rest hit it
        if b < _BUCKETS:
            mean = (p1[b] + cap * (total - p0[b])) / total
            second = (p2[b] + cap * cap * (total - p0[b])) / total
        else:
            mean, second = s1 / total, p2[-1] / total
        var = max(0.0, second - mean * mean)
        if s1 <= 0.0:
            return OutputStats(p50, p90, mean, var, 0.0, 0.0, 0.0)
        # A sequence seen running at a random instant is length-biased (weight w * m) and uniformly
        # far into its reply, so its remaining length is R = m * U. Over this reply's horizon of T
        # decode steps it grows by min(R, T): per bucket m/2 and m^2/3 when m <= T, else
        # T - T^2/(2m) and T^2 - 2T^3/(3m). Prefix sums make that O(log buckets).
        t = float(max(p90, math.ceil(mean)))
        b = bisect_right(_REPS, t)
        over_w, over_m = total - p0[b], s1 - p1[b]
        g1 = (0.5 * p2[b] + t * over_m - 0.5 * t * t * over_w) / s1
        g2 = (p3[b] / 3.0 + t * t * over_m - (2.0 / 3.0) * t * t * t * over_w) / s1
        return OutputStats(p50, p90, mean, var, s1 / total, g1, max(0.0, g2 - g1 * g1))


class _PromptRatio:
    """Decayed sums of prompt characters, reported prompt tokens and prompts, for one model."""

    __slots__ = ("chars", "tokens", "count")

    def __init__(self, chars: float, tokens: float, count: float) -> None:
        self.chars, self.tokens, self.count = chars, tokens, count


class CostModel:
    """Estimates request costs and learns from the usage that backends report.

    One per gateway process; holds one calibration and one histogram per model seen (models are
    validated before cost estimation, so that set is the fleet's models). Not thread-safe: call it
    from the event loop only.
    """

    def __init__(
        self,
        *,
        tokenizers: Mapping[str, Tokenizer] | None = None,
        chars_per_token: float = DEFAULT_CHARS_PER_TOKEN,
        prompt_half_life: float = 200.0,
        output_half_life: float = 500.0,
        output_prior_median: float = DEFAULT_OUTPUT_MEDIAN,
        prior_weight: float = 4.0,
    ) -> None:
        figures = (chars_per_token, prompt_half_life, output_half_life, output_prior_median,
                   prior_weight)
        if not all(f > 0 for f in figures):
            raise ValueError("cost model figures (ratios, half-lives, priors) must be > 0")
        self._tokenizers = dict(tokenizers or {})
        self._prompt_decay = 0.5 ** (1.0 / prompt_half_life)
        self._chars_per_token = chars_per_token
        self._output_half_life = output_half_life
        self._output_prior_median = output_prior_median
        self._prior_weight = prior_weight
        self._ratios: dict[str, _PromptRatio] = {}
        self._lengths: dict[str, LengthHistogram] = {}

    def _ratio(self, model: str) -> _PromptRatio:
        ratio = self._ratios.get(model)
        if ratio is None:
            prior_tokens = self._prior_weight * DEFAULT_PROMPT_TOKENS
            ratio = _PromptRatio(prior_tokens * self._chars_per_token, prior_tokens,
                                 self._prior_weight)
            self._ratios[model] = ratio
        return ratio

    def lengths(self, model: str) -> LengthHistogram:
        """The model's output-length distribution (the prior until replies are observed)."""
        hist = self._lengths.get(model)
        if hist is None:
            hist = LengthHistogram(half_life=self._output_half_life,
                                   prior_median=self._output_prior_median,
                                   prior_weight=self._prior_weight)
            self._lengths[model] = hist
        return hist

    def tokens_per_char(self, model: str) -> float:
        """The model's calibrated prompt tokens per character (1/chars_per_token before usage)."""
        ratio = self._ratio(model)
        return ratio.tokens / ratio.chars if ratio.chars > 0 else 1.0 / self._chars_per_token

    def estimate(self, model: str, prompt: str, max_tokens: int | None) -> RequestCost:
        """`prompt` is the text the model reads (for chat, the messages' contents)."""
        ratio = self._ratio(model)
        per_char = self.tokens_per_char(model)
        tokenizer = self._tokenizers.get(model)
        if tokenizer is not None:
            prompt_tokens, exact = tokenizer.count(prompt), True
        else:
            prompt_tokens, exact = max(1, math.ceil(len(prompt) * per_char)), False
        out = self.lengths(model).stats(max_tokens)
        return RequestCost(
            model=model, prompt_chars=len(prompt), prompt_tokens=prompt_tokens, exact=exact,
            tokens_per_char=per_char, max_tokens=max_tokens, output_p50=out.p50,
            output_p90=out.p90, output_mean=out.mean, output_var=out.var,
            typical_prompt_tokens=ratio.tokens / ratio.count, mean_output_all=out.mean_all,
            inflight_growth_mean=out.growth_mean, inflight_growth_var=out.growth_var,
        )

    def observe(
        self, cost: RequestCost, *, prompt_tokens: int | None, completion_tokens: int | None
    ) -> None:
        """Learn from a finished request's reported usage (either figure may be missing).

        A reply cut at max_tokens is recorded at its cut length: the distribution is of replies
        as clients bound them, which is what the next similar request will see.
        """
        if prompt_tokens is not None and prompt_tokens >= 0:
            ratio = self._ratio(cost.model)
            d = self._prompt_decay
            ratio.chars = ratio.chars * d + cost.prompt_chars
            ratio.tokens = ratio.tokens * d + prompt_tokens
            ratio.count = ratio.count * d + 1.0
        if completion_tokens is not None and completion_tokens >= 0:
            self.lengths(cost.model).observe(completion_tokens)
