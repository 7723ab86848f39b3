"""`kvgate cache eval`: the semantic tier's precision and recall on labelled question pairs.

    kvgate cache eval [--data FILE] [--embedder auto|minilm|openai|hashing] [--threshold T]
                      [--split all|dev|holdout] [--no-guard] [--url URL --model NAME]

Prints one row per kind of pair at the threshold (the embedder's own unless given), then the
sweep over thresholds. Exit codes: 0 done, 2 bad usage (a malformed data file, an embedder this
installation lacks), 1 the embedder failed (a remote endpoint that did not answer).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gateway.cli import UsageError


def register(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `eval` to the `kvgate cache` actions."""
    text = "precision and recall of the semantic tier on labelled question pairs"
    sub = actions.add_parser("eval", help=text, description=text)
    sub.add_argument("--data", type=Path, default=None, metavar="FILE",
                     help="JSON lines of pairs (default: the project's tests/data set)")
    sub.add_argument("--embedder", default="auto",
                     help="auto (default), minilm (or local), openai or hashing")
    sub.add_argument("--threshold", type=float, default=None, metavar="T",
                     help="cosine for a hit (default: the embedder's)")
    sub.add_argument("--split", default="all", choices=("all", "dev", "holdout"),
                     help="which pairs (default all)")
    sub.add_argument("--no-guard", dest="guard", action="store_false",
                     help="the embedder alone, without the near-miss guard")
    sub.add_argument("--url", default="", help="openai: the embeddings endpoint")
    sub.add_argument("--model", default="", help="openai: the embedding model")
    sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gateway.cache import eval as evaluation
    from gateway.cache.embedders import choice

    try:
        pairs = evaluation.load_pairs(args.data or evaluation.DATA)
        kind = choice.resolve(args.embedder, choice.local_installed())
        settings = choice.EmbedderSettings(kind=kind, url=args.url, model=args.model)
        embedder = choice.build(settings)
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if args.split != "all":
        pairs = [pair for pair in pairs if pair.split == args.split]
    if not pairs:
        raise UsageError(f"no pairs in the {args.split} split")
    threshold = choice.THRESHOLDS[kind] if args.threshold is None else args.threshold
    if not 0 < threshold <= 1:
        raise UsageError(f"--threshold must be in (0, 1], got {threshold}")
    try:
        similarities = asyncio.run(evaluation.similarities(embedder, pairs))
    except ValueError as exc:
        print(f"kvgate cache eval: {exc}", file=sys.stderr)
        return 1
    rows = evaluation.scored(pairs, similarities)
    guarded = "with the guard" if args.guard else "without the guard"
    report = evaluation.render(
        evaluation.evaluate(rows, threshold, use_guard=args.guard),
        f"{embedder.name}, {guarded}, threshold {threshold:g}, {len(pairs)} pairs"
        f" ({args.split})")
    swept = evaluation.render(evaluation.sweep(rows, use_guard=args.guard),
                              "threshold sweep (kind = threshold; every pair)")
    try:
        print(f"{report}\n\n{swept}")
    except BrokenPipeError:  # `kvgate cache eval | head`: the reader has what it wanted
        return 0
    return 0
