"""Fitting the classifier: L2-regularised logistic regression by Newton's method (numpy).

The objective is strictly convex, so Newton's method reaches its one minimum whatever the order
of the arithmetic: weights trained twice from the same data (for kind minilm, the same
embeddings), seed and penalty agree to far better than 1e-6. The seed only draws the
cross-validation folds; the shipped `hard_scores` and `easy_scores` are each training prompt
scored by the fold's model that did not see it.

The cheap features are standardised (training mean and scale); the bias is penalised only
nominally. numpy is needed here (the `semantic` extra), not to score.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from routing.difficulty.features import CHEAP_NAMES, HASHED_DIMENSIONS, cheap, hashed
from routing.difficulty.model import HASHED_SPACE, Kind, Weights, score

Matrix = npt.NDArray[np.float64]
FOLDS = 5
MAX_STEPS = 100
BIAS_L2 = 1e-4  # all but unpenalised, and keeps the Woodbury form's D invertible


def vectors_of(kind: Kind, texts: Sequence[str],
               embeddings: Sequence[Sequence[float]] | None) -> Matrix:
    """The vector part of the design matrix: the embeddings, or the hashed features."""
    if kind == "minilm":
        if embeddings is None:
            raise ValueError("the minilm classifier is trained on the prompts' embeddings")
        return np.asarray(embeddings, dtype=np.float64)
    matrix = np.zeros((len(texts), HASHED_DIMENSIONS))
    for row, text in enumerate(texts):
        for bucket, value in hashed(text).items():
            matrix[row, bucket] = value
    return matrix


def newton(design: Matrix, hard: Matrix, l2: float) -> Matrix:
    """The weights (bias first) minimising the logistic loss plus l2/2 * |w|^2, the bias
    penalised only by BIAS_L2. Each step solves its linear system in the prompts' n x n form
    (Woodbury), as there are fewer prompts than features."""
    penalty = np.full(design.shape[1], l2)
    penalty[0] = BIAS_L2
    inverse = 1.0 / penalty
    kernel = (design * inverse) @ design.T  # X D^-1 X^T
    weights = np.zeros(design.shape[1])
    identity = np.eye(design.shape[0])
    for _ in range(MAX_STEPS):
        odds = 1.0 / (1.0 + np.exp(-(design @ weights)))
        gradient = design.T @ (odds - hard) + penalty * weights
        root = np.sqrt(odds * (1.0 - odds))
        scaled = inverse * gradient  # D^-1 g
        inner = np.linalg.solve(identity + root[:, None] * kernel * root[None, :],
                                root * (design @ scaled))
        step = scaled - inverse * (design.T @ (root * inner))
        weights = weights - step
        if float(np.max(np.abs(step))) < 1e-12:
            break
    return weights


def fit(kind: Kind, space: str, texts: Sequence[str], hard: Sequence[bool],
        vectors: Matrix, l2: float, calibration: tuple[tuple[float, ...], tuple[float, ...]]
        = ((), ())) -> Weights:
    """One classifier from these prompts, `calibration` its (hard, easy) out-of-fold scores."""
    features = np.asarray([cheap(text) for text in texts], dtype=np.float64)
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale[scale < 1e-9] = 1.0
    design = np.hstack([np.ones((len(texts), 1)), (features - mean) / scale, vectors])
    weights = newton(design, np.asarray(hard, dtype=np.float64), l2)
    count = len(CHEAP_NAMES)
    return Weights(
        kind=kind, space=space, dimensions=vectors.shape[1], bias=float(weights[0]),
        cheap_mean=tuple(map(float, mean)), cheap_scale=tuple(map(float, scale)),
        cheap_weights=tuple(map(float, weights[1:1 + count])),
        vector_weights=tuple(map(float, weights[1 + count:])),
        hard_scores=calibration[0], easy_scores=calibration[1])


def folds(hard: Sequence[bool], seed: int) -> list[int]:
    """Each prompt's fold, stratified by label, drawn with `seed`."""
    rng = np.random.default_rng(seed)
    assigned = [0] * len(hard)
    for label in (True, False):
        members = [index for index, value in enumerate(hard) if value is label]
        for rank, position in enumerate(rng.permutation(len(members))):
            assigned[members[int(position)]] = rank % FOLDS
    return assigned


def train(kind: Kind, texts: Sequence[str], hard: Sequence[bool], *, seed: int, l2: float,
          embeddings: Sequence[Sequence[float]] | None = None,
          space: str = HASHED_SPACE) -> Weights:
    """The classifier of `kind` trained on all of `texts`, calibrated out of fold."""
    vectors = vectors_of(kind, texts, embeddings)
    assigned = folds(hard, seed)
    out_of_fold: list[float] = [0.0] * len(texts)
    for fold in range(FOLDS):
        inside = [index for index, value in enumerate(assigned) if value != fold]
        model = fit(kind, space, [texts[i] for i in inside], [hard[i] for i in inside],
                    vectors[inside], l2)
        for index, value in enumerate(assigned):
            if value == fold:
                out_of_fold[index] = score(model, texts[index], vectors[index].tolist())
    hard_scores = tuple(sorted(s for s, label in zip(out_of_fold, hard, strict=True) if label))
    easy_scores = tuple(sorted(s for s, label in zip(out_of_fold, hard, strict=True)
                               if not label))
    return fit(kind, space, texts, hard, vectors, l2, (hard_scores, easy_scores))
