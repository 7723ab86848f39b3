"""Scoring a prompt: logistic regression over its cheap features and its vector.

A `Weights` is one trained classifier. Its vector is either the prompt's sentence embedding
(kind `minilm`: the gateway computes it and passes it in, `space` naming the embedder whose
vectors the weights were trained on) or the prompt's hashed word features (kind `hashed`:
computed here from the text). The cheap features are standardised with the training split's
mean and scale before their weights apply.

`score` is the probability that the prompt is hard, in [0, 1]: the router sends a prompt small
when its score is below the threshold in force. `hard_scores` and `easy_scores` are the training
split's scores measured out of fold (each prompt scored by a model that did not see it), which
is what a threshold is calibrated against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from typing import Literal

from routing.difficulty.features import cheap, hashed

Kind = Literal["minilm", "hashed"]
HASHED_SPACE = "hashed-words"


@dataclass(frozen=True, slots=True)
class Weights:
    kind: Kind
    space: str  # the vector space: the embedder's name, or HASHED_SPACE
    dimensions: int  # the vector's length
    bias: float
    cheap_mean: tuple[float, ...]
    cheap_scale: tuple[float, ...]
    cheap_weights: tuple[float, ...]
    vector_weights: tuple[float, ...]
    hard_scores: tuple[float, ...]  # out-of-fold scores of the training hard prompts, ascending
    easy_scores: tuple[float, ...]  # and of its easy ones


def logit(weights: Weights, text: str, embedding: Sequence[float] | None = None) -> float:
    """The classifier's log-odds that `text` is hard. Kind `minilm` needs `embedding`, the
    text's vector in `weights.space` (ValueError without it, or of the wrong length)."""
    total = weights.bias
    for value, mean, scale, weight in zip(cheap(text), weights.cheap_mean, weights.cheap_scale,
                                          weights.cheap_weights, strict=True):
        total += (value - mean) / scale * weight
    if weights.kind == "hashed":
        vector_weights = weights.vector_weights
        total += sum(value * vector_weights[bucket] for bucket, value in hashed(text).items())
        return total
    if embedding is None or len(embedding) != weights.dimensions:
        raise ValueError(f"the {weights.space} classifier needs the prompt's "
                         f"{weights.dimensions}-dimensional embedding")
    return total + float(sum(map(mul, embedding, weights.vector_weights)))


def sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    odds = math.exp(value)
    return odds / (1.0 + odds)


def score(weights: Weights, text: str, embedding: Sequence[float] | None = None) -> float:
    """The probability that `text` is hard (see `logit`)."""
    return sigmoid(logit(weights, text, embedding))
