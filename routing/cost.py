"""What one request costs a backend: prompt tokens, output tokens and the KV blocks they hold.

- Prompt tokens come from an injected exact `Tokenizer` when one is configured for the model, else
  from a character count times a tokens-per-character ratio that is calibrated per model, online,
  from the `usage.prompt_tokens` the backends report (chat-template overhead folds into the ratio).
- Output tokens are a distribution, not a single mean: per model, a censoring-aware decayed log
  histogram of natural reply lengths (routing/output_length.py), from which a request's own reply
  is its natural length bounded by its `max_tokens` (with none, the context left after its
  prompt) and floored by its `min_tokens`. With `ignore_eos`, or `min_tokens == max_tokens`, the
  reply is exactly `max_tokens` long: no distribution.
- A request's KV footprint at its peak is `ceil((prompt + expected output) / block_size)` blocks;
  its own reservation uses the reply's `reservation_quantile` instead of its mean, and never less
  than the mean. What the gateway's ledger holds and admission counts is its `hold`
  (routing/kv_hold.py): that reservation, the expected blocks and the reply's margin at the
  quantile (z standard deviations, z the normal quantile of `reservation_quantile`), which a
  backend's requests pool: together they hold their expected blocks plus z standard deviations
  of their total, never more than the sum of their own reservations.

Learning is counted in observations, not in seconds, so nothing here needs a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

from routing.kv_hold import Hold
from routing.output_length import DEFAULT_RESERVATION_QUANTILE, LengthHistogram, OutputStats

DEFAULT_CHARS_PER_TOKEN = 4.0  # English text under BPE tokenizers, and the simulator's rule
DEFAULT_PROMPT_TOKENS = 512.0  # prior for a model's typical prompt, before any usage is reported
DEFAULT_OUTPUT_MEDIAN = 256.0  # prior output length median (lognormal, sigma 1) before any reply
DEFAULT_CONTEXT_TOKENS = 8192  # a backend's context length when nothing says otherwise
LENGTH = "length"  # the finish_reason of a reply cut at its max_tokens (or the context's end)

class Tokenizer(Protocol):
    """An exact token counter for one model (e.g. backed by the `tokenizers` package)."""

    def count(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True)
class RequestCost:
    """One request's estimated cost. Token figures are counts; blocks depend on the backend."""

    model: str
    prompt_chars: int
    prompt_tokens: int
    exact: bool  # prompt_tokens came from a tokenizer, not from the character ratio
    tokens_per_char: float  # the model's calibrated ratio when this estimate was made
    max_tokens: int | None  # the reply's cap: the client's, else the context left (None: none)
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
    # The output's quantile at the reservation quantile (None: output_p90).
    output_reserve: int | None = None
    exact_output: bool = False  # ignore_eos, or min_tokens == max_tokens: exactly max_tokens
    # The reply's margin over its mean at the reservation quantile, in tokens: z standard
    # deviations (0 for a quantile at or below the median, or an exact reply).
    output_margin: float = 0.0

    @property
    def peak_tokens(self) -> int:
        return self.prompt_tokens + math.ceil(self.output_mean)

    @property
    def reserve_output(self) -> int:
        """The output tokens the reservation holds: its quantile, never below the mean."""
        quantile = self.output_p90 if self.output_reserve is None else self.output_reserve
        return max(quantile, math.ceil(self.output_mean))

    @property
    def reserve_tokens(self) -> int:
        return self.prompt_tokens + self.reserve_output

    def peak_blocks(self, block_size: int) -> int:
        """KV blocks held at the expected end of the reply: what the gateway's ledger reserves."""
        return -(-self.peak_tokens // block_size)

    def reserve_blocks(self, block_size: int) -> int:
        """KV blocks held if the reply runs to its reservation quantile: what the ledger holds."""
        return -(-self.reserve_tokens // block_size)

    def hold(self, block_size: int, cached_tokens: int = 0) -> Hold:
        """What the ledger holds for it (routing/kv_hold.py), its first `cached_tokens` prompt
        tokens left out (a prefix cached there is shared with whoever cached it)."""
        prompt = self.prompt_tokens - cached_tokens if self.prompt_tokens > cached_tokens else 0
        own = -(-(prompt + self.reserve_output) // block_size)
        base = -(-(prompt + math.ceil(self.output_mean)) // block_size)
        margin = self.output_margin / block_size
        return Hold(own, base if base < own else own, math.ceil(margin * margin))

    def prompt_blocks(self, block_size: int) -> int:
        return -(-self.prompt_tokens // block_size)

    def prefix_tokens(self, chars: int) -> int:
        """Tokens in the first `chars` characters of the prompt (for a cached prefix)."""
        return min(self.prompt_tokens, int(chars * self.tokens_per_char))


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
        reservation_quantile: float = DEFAULT_RESERVATION_QUANTILE,
        context_tokens: int | None = DEFAULT_CONTEXT_TOKENS,
    ) -> None:
        """`reservation_quantile`: the quantile of a reply's length its reservation holds;
        `context_tokens`: the context length a request without max_tokens may run to (None: no
        cap)."""
        figures = (chars_per_token, prompt_half_life, output_half_life, output_prior_median,
                   prior_weight)
        if not all(f > 0 for f in figures):
            raise ValueError("cost model figures (ratios, half-lives, priors) must be > 0")
        if not 0.0 < reservation_quantile < 1.0:
            raise ValueError("the reservation quantile must be in (0, 1)")
        if context_tokens is not None and context_tokens < 1:
            raise ValueError("context_tokens must be >= 1 (or None)")
        self._tokenizers = dict(tokenizers or {})
        self._prompt_decay = 0.5 ** (1.0 / prompt_half_life)
        self._chars_per_token = chars_per_token
        self._output_half_life = output_half_life
        self._output_prior_median = output_prior_median
        self._prior_weight = prior_weight
        self._reservation_quantile = reservation_quantile
        self._z = max(0.0, NormalDist().inv_cdf(reservation_quantile))
        self._context_tokens = context_tokens
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
                                   prior_weight=self._prior_weight,
                                   reservation_quantile=self._reservation_quantile)
            self._lengths[model] = hist
        return hist

    def tokens_per_char(self, model: str) -> float:
        """The model's calibrated prompt tokens per character (1/chars_per_token before usage)."""
        ratio = self._ratio(model)
        return ratio.tokens / ratio.chars if ratio.chars > 0 else 1.0 / self._chars_per_token

    def output_cap(self, max_tokens: int | None, prompt_tokens: int) -> int | None:
        """The most a reply can emit: its max_tokens, else the context left after its prompt."""
        if max_tokens is not None:
            return max_tokens
        if self._context_tokens is None:
            return None
        return max(1, self._context_tokens - prompt_tokens)

    def estimate(self, model: str, prompt: str, max_tokens: int | None, *,
                 min_tokens: int = 0, ignore_eos: bool = False,
                 prompt_tokens: int | None = None) -> RequestCost:
        """`prompt` is the text the model reads (for chat, the messages' contents);
        `prompt_tokens`: its exact count when the client sent token ids."""
        ratio = self._ratio(model)
        per_char = self.tokens_per_char(model)
        tokenizer = self._tokenizers.get(model)
        if prompt_tokens is not None:
            tokens, exact = max(1, prompt_tokens), True
        elif tokenizer is not None:
            tokens, exact = tokenizer.count(prompt), True
        else:
            tokens, exact = max(1, math.ceil(len(prompt) * per_char)), False
        cap = self.output_cap(max_tokens, tokens)
        exact_output = cap is not None and (ignore_eos or min_tokens >= cap)
        floor = cap if exact_output and cap is not None else max(0, min_tokens)
        out: OutputStats = self.lengths(model).stats(cap, floor)
        return RequestCost(
            model=model, prompt_chars=len(prompt), prompt_tokens=tokens, exact=exact,
            tokens_per_char=per_char, max_tokens=cap, output_p50=out.p50,
            output_p90=out.p90, output_mean=out.mean, output_var=out.var,
            typical_prompt_tokens=ratio.tokens / ratio.count, mean_output_all=out.mean_all,
            inflight_growth_mean=out.growth_mean, inflight_growth_var=out.growth_var,
            output_reserve=out.reserve, exact_output=exact_output,
            output_margin=0.0 if exact_output else self._z * math.sqrt(out.var),
        )

    def reserve_from(self, cost: RequestCost, emitted: int) -> int:
        """The output tokens to reserve for `cost`'s reply once it has emitted `emitted`: the
        reservation quantile of the replies that run that long, within its cap (at least one
        token past `emitted` while the cap allows)."""
        cap = cost.max_tokens
        if cost.exact_output and cap is not None:
            return cap
        ahead = self.lengths(cost.model).quantile_from(self._reservation_quantile, emitted + 1)
        tokens = max(emitted + 1, math.ceil(ahead))
        return tokens if cap is None else min(cap, tokens)

    def observe(
        self, cost: RequestCost, *, prompt_tokens: int | None, completion_tokens: int | None,
        finish_reason: str | None = None,
    ) -> None:
        """Learn from a finished request's reported usage (either figure may be missing).

        A reply that ended with `finish_reason: length` was cut (at its max_tokens or the
        context's end): its natural length is at least that, and it is learned as censored
        there. A reply whose length the request dictated (ignore_eos, min_tokens at the cap)
        says nothing about natural lengths and is not learned from.
        """
        if prompt_tokens is not None and prompt_tokens >= 0:
            ratio = self._ratio(cost.model)
            d = self._prompt_decay
            ratio.chars = ratio.chars * d + cost.prompt_chars
            ratio.tokens = ratio.tokens * d + prompt_tokens
            ratio.count = ratio.count * d + 1.0
        if completion_tokens is not None and completion_tokens >= 0 and not cost.exact_output:
            self.lengths(cost.model).observe(completion_tokens,
                                             censored=finish_reason == LENGTH)
