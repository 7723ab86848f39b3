"""Trains the small-model router's classifiers and writes the weights kvgate ships.

    .venv/bin/python scripts/train_router.py [--data tests/data/routing_prompts.jsonl]
                                             [--out routing/difficulty/data] [--kind minilm|hashed]

From the labelled file's train split only (the eval split and the held-out files are for
route-eval), with a fixed seed and penalty: the same data gives the same weights to 1e-6 (to
1e-5 for minilm on another CPU family, whose onnxruntime kernels round the embeddings
differently; tests/test_routing_difficulty_train.py retrains and compares). Kind `minilm` embeds
the prompts with the local MiniLM model (the `semantic` extra); kind `hashed` needs nothing
beyond numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from routing.difficulty.labelled import Prompt, read_prompts  # noqa: E402
from routing.difficulty.model import HASHED_SPACE, Kind, Weights  # noqa: E402
from routing.difficulty.weights import to_json  # noqa: E402

DATA = ROOT / "tests" / "data" / "routing_prompts.jsonl"
OUT = ROOT / "routing" / "difficulty" / "data"
SEED = 20240917
L2 = 0.01  # of those tried, the penalty sending the most easy prompts small out of fold at a
#            5% hard share (the eval split plays no part in choosing it)
KINDS: tuple[Kind, ...] = ("minilm", "hashed")


def trained(kind: Kind, prompts: Sequence[Prompt]) -> Weights:
    from routing.difficulty.train import train

    texts = [prompt.text for prompt in prompts]
    hard = [prompt.hard for prompt in prompts]
    if kind == "hashed":
        return train(kind, texts, hard, seed=SEED, l2=L2, space=HASHED_SPACE)
    from gateway.cache.embedders.local import NAME
    from gateway.route_eval import embed_all

    return train(kind, texts, hard, seed=SEED, l2=L2, embeddings=embed_all(texts), space=NAME)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--kind", choices=KINDS, action="append")
    args = parser.parse_args(argv)
    raw = args.data.read_bytes()
    prompts = [prompt for prompt in read_prompts(raw.decode()) if prompt.split == "train"]
    meta = {"data": args.data.name, "data_sha256": hashlib.sha256(raw).hexdigest(),
            "split": "train", "prompts": len(prompts), "seed": SEED, "l2": L2}
    for kind in args.kind or KINDS:
        weights = trained(kind, prompts)
        path = args.out / f"{kind}.json"
        path.write_text(to_json(weights, meta), encoding="utf-8")
        print(f"{path}: {kind}, {len(prompts)} prompts, {weights.dimensions} dimensions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
