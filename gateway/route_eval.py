"""`kvgate route-eval`: how each small-model routing alias of a config routes a labelled set.

    kvgate route-eval --config FILE --data FILE [--split eval|train|all] [--target SHARE]
                      [--calibrate]

For every `small_model[]` alias, each prompt goes through the alias's rules (as a one-turn
request without max_tokens) and, when no rule decides, its classifier. Printed per alias: the
classifier and the threshold in force, the confusion matrix (easy/hard by sent small/large),
the share routed small, the hard prompts wrongly sent small, and the threshold that meets the
target share of hard prompts sent small on this data (the alias's `max_hard_share` unless
`--target`). `--calibrate` also prints that threshold as the config line that sets it.

The data is JSON lines (`text`, `label` easy|hard, `domain`, `split`); `--split` (default eval)
keeps the prompts of that split, `all` every one. Exit codes: 0 done, 2 bad usage (a missing or
malformed file, a bad config, a classifier this installation lacks).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from gateway.cli import UsageError

EMBED_BATCH = 16


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    text = "how each small-model routing alias routes a labelled set of prompts"
    sub = subparsers.add_parser("route-eval", help=text, description=text)
    sub.add_argument("--config", type=Path, required=True, metavar="FILE",
                     help="the gateway config whose small_model aliases are evaluated")
    sub.add_argument("--data", type=Path, required=True, metavar="FILE",
                     help="JSON lines: text, label (easy|hard), domain, split")
    sub.add_argument("--split", default="eval", choices=("eval", "train", "all"),
                     help="which prompts (default eval)")
    sub.add_argument("--target", type=float, default=None, metavar="SHARE",
                     help="the share of hard prompts that may go small (default: each "
                     "alias's max_hard_share)")
    sub.add_argument("--calibrate", action="store_true",
                     help="print the threshold meeting the target and its config line")
    sub.set_defaults(func=run)


def embed_all(texts: Sequence[str]) -> list[list[float]]:
    """Each text's MiniLM vector, embedded in batches of similar length (a text's vector does
    not depend on its batch)."""
    from gateway.cache.embedders.local import MiniLM

    model = MiniLM()
    order = sorted(range(len(texts)), key=lambda index: len(texts[index]))
    vectors: list[list[float]] = [[] for _ in texts]
    for start in range(0, len(order), EMBED_BATCH):
        batch = order[start:start + EMBED_BATCH]
        for index, row in zip(batch, model.encode([texts[i] for i in batch]), strict=True):
            vectors[index] = [float(value) for value in row]
    return vectors


def run(args: argparse.Namespace) -> int:
    from gateway.config import load_settings
    from gateway.small_model import ClassifierUnavailable
    from routing.difficulty.labelled import read_prompts

    settings = load_settings(args.config)
    if not settings.small_model:
        raise UsageError(f"{args.config}: no small_model aliases to evaluate")
    try:
        prompts = read_prompts(args.data.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{args.data}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise UsageError(f"{args.data}: {exc}") from exc
    if args.split != "all":
        prompts = [prompt for prompt in prompts if prompt.split == args.split]
    if not prompts:
        raise UsageError(f"{args.data}: no prompts in the {args.split} split")
    if args.target is not None and not 0 <= args.target <= 1:
        raise UsageError(f"--target must be in [0, 1], got {args.target}")
    from gateway.cache.embedders.choice import local_installed
    from gateway.route_report import evaluate_alias, render
    from gateway.small_model import cache_uses_local, kind_of

    installed = local_installed()
    cache_local = cache_uses_local(settings.cache, installed)
    try:
        kinds = [kind_of(route.classifier, installed, cache_local)
                 for route in settings.small_model]
    except ClassifierUnavailable as exc:
        raise UsageError(str(exc)) from exc
    vectors = embed_all([p.text for p in prompts]) if "minilm" in kinds else None
    blocks: list[str] = [f"{args.data}: {args.split} split, {len(prompts)} prompts "
                         f"({sum(p.hard for p in prompts)} hard, "
                         f"{sum(not p.hard for p in prompts)} easy)"]
    for route, kind in zip(settings.small_model, kinds, strict=True):
        report = evaluate_alias(route, kind, prompts, vectors, target=args.target)
        blocks.append(render(report, calibrate=args.calibrate))
    try:
        print("\n\n".join(blocks))
    except BrokenPipeError:  # `kvgate route-eval ... | head`: the reader has what it wanted
        return 0
    return 0
