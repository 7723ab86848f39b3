"""The shipped classifier weights are what `scripts/train_router.py` makes of the labelled set's
train split: retrained here from the same data, seed and penalty, they agree to 1e-6 (the
minilm ones to 1e-5: onnxruntime's float kernels differ by CPU family, and the embeddings with
them in their last bits; the same embeddings train the same weights exactly). And on the
eval split, which training never saw, the default alias (max_hard_share 0.05) sends at most 5%
of the hard prompts small while sending at least half of the easy ones small, with either
classifier (minilm, and hashed where the local model is not installed)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

from gateway.cache.embedders.choice import local_installed
from gateway.route_eval import embed_all
from gateway.route_report import evaluate_alias
from gateway.small_model_settings import SmallModelRouteSettings
from routing.difficulty.labelled import read_prompts
from routing.difficulty.model import Kind, Weights
from routing.difficulty.weights import FIELDS, shipped

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = read_prompts((ROOT / "tests" / "data" / "routing_prompts.jsonl").read_text("utf-8"))
needs_local = pytest.mark.skipif(not local_installed(), reason="needs kvgate[semantic]")


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_router",
                                                  ROOT / "scripts" / "train_router.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_close(retrained: Weights, kept: Weights, tolerance: float = 1e-6) -> None:
    for field in FIELDS:
        mine, theirs = getattr(retrained, field), getattr(kept, field)
        if isinstance(mine, tuple):
            assert len(mine) == len(theirs), field
            worst = max((abs(a - b) for a, b in zip(mine, theirs, strict=True)), default=0.0)
            assert worst <= tolerance, f"{field} differs by {worst}"
        elif isinstance(mine, float):
            assert math.isclose(mine, theirs, abs_tol=tolerance), field
        else:
            assert mine == theirs, field


# Measured between an Intel Xeon and an AMD EPYC: minilm weights 1.1e-6 apart at most.
TOLERANCE = {"hashed": 1e-6, "minilm": 1e-5}


@pytest.mark.parametrize("kind", [
    pytest.param("hashed", id="hashed: retrained, the same weights to 1e-6"),
    pytest.param("minilm", marks=needs_local, id="minilm: retrained, the same weights to 1e-5"),
])
def test_retraining_reproduces_the_shipped_weights(kind: Kind) -> None:
    train = [prompt for prompt in PROMPTS if prompt.split == "train"]
    assert_close(script().trained(kind, train), shipped(kind), TOLERANCE[kind])


@needs_local
def test_the_same_embeddings_train_the_same_weights_exactly() -> None:
    from gateway.cache.embedders.local import NAME
    from routing.difficulty.train import train

    prompts = [prompt for prompt in PROMPTS if prompt.split == "train"]
    texts, hard = [p.text for p in prompts], [p.hard for p in prompts]
    embeddings = embed_all(texts)
    module = script()

    def once() -> Weights:
        return train("minilm", texts, hard, seed=module.SEED, l2=module.L2,
                     embeddings=embeddings, space=NAME)

    assert_close(once(), once(), 0.0)


EVAL = [prompt for prompt in PROMPTS if prompt.split == "eval"]


@pytest.mark.parametrize(("kind", "max_hard_small", "min_easy_small"), [
    pytest.param("minilm", 0.05, 0.5, marks=needs_local,
                 id="minilm: at most 5% of hard prompts small, at least half the easy ones"),
    pytest.param("hashed", 0.05, 0.5,
                 id="hashed: at most 5% of hard prompts small, at least half the easy ones"),
])
def test_the_eval_split_routes_within_the_targets(kind: Kind, max_hard_small: float,
                                                  min_easy_small: float) -> None:
    route = SmallModelRouteSettings(alias="auto", large="big", small="tiny")
    vectors = embed_all([prompt.text for prompt in EVAL]) if kind == "minilm" else None
    report = evaluate_alias(route, kind, EVAL, vectors)
    assert report.confusion.hard_small_share <= max_hard_small
    assert report.confusion.easy_small_share >= min_easy_small
