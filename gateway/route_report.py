"""What `kvgate route-eval` computes and prints for one alias: its decisions on labelled prompts.

A prompt a rule sends large counts as scored 1.0 (certain), so the threshold that meets a target
is read over every hard prompt, those the rules catch included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.small_model import classifier_of
from gateway.small_model_settings import SmallModelRouteSettings
from routing.difficulty.calibrate import Thresholds
from routing.difficulty.evaluate import Confusion, confusion, meeting
from routing.difficulty.labelled import Prompt
from routing.difficulty.model import Kind, score
from routing.model_select import Ask, certain

CERTAIN = 1.0  # the score of a prompt a rule sends large
SHOWN = 20  # the hard prompts sent small listed, at most


@dataclass(frozen=True, slots=True)
class AliasReport:
    route: SmallModelRouteSettings
    kind: Kind
    space: str
    thresholds: Thresholds
    confusion: Confusion  # at the threshold in force (no pressure)
    by_rules: int  # prompts a rule sent large
    wrong: tuple[tuple[float, str], ...]  # hard prompts sent small: (score, text), worst first
    target: float  # the share of hard prompts that may go small
    meeting: float  # the threshold that meets it on this data
    at_meeting: Confusion


def evaluate_alias(route: SmallModelRouteSettings, kind: Kind, prompts: Sequence[Prompt],
                   vectors: Sequence[Sequence[float]] | None, *,
                   target: float | None = None) -> AliasReport:
    """`route`'s decisions on `prompts` (`vectors`: their embeddings, for kind minilm)."""
    classifier = classifier_of(route, kind)
    small_route = route.to_route()
    scored: list[tuple[float, bool]] = []
    by_rules = 0
    for index, prompt in enumerate(prompts):
        if certain(small_route, Ask(text=prompt.text, max_tokens=None, turns=1)) is not None:
            by_rules += 1
            scored.append((CERTAIN, prompt.hard))
            continue
        vector = vectors[index] if vectors is not None else None
        scored.append((score(classifier.weights, prompt.text, vector), prompt.hard))
    base = classifier.thresholds.base
    wrong = sorted(((value, prompt.text) for (value, hard), prompt in zip(scored, prompts,
                                                                          strict=True)
                    if hard and value < base), reverse=True)
    goal = route.max_hard_share if target is None else target
    meets = meeting(scored, goal)
    return AliasReport(
        route=route, kind=kind, space=classifier.weights.space,
        thresholds=classifier.thresholds, confusion=confusion(scored, base), by_rules=by_rules,
        wrong=tuple(wrong), target=goal, meeting=meets, at_meeting=confusion(scored, meets))


def percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100.0 * part / whole:.1f}%)" if whole else "0/0"


def shares(matrix: Confusion) -> str:
    easy = matrix.easy_small + matrix.easy_large
    hard = matrix.hard_small + matrix.hard_large
    return (f"routed small {percent(matrix.easy_small + matrix.hard_small, easy + hard)}; "
            f"easy sent small {percent(matrix.easy_small, easy)}; "
            f"hard sent small {percent(matrix.hard_small, hard)}")


def render(report: AliasReport, *, calibrate: bool = False) -> str:
    route, limits, matrix = report.route, report.thresholds, report.confusion
    source = (f"threshold {route.threshold:g}" if route.threshold is not None
              else f"max_hard_share {route.max_hard_share:g}")
    lines = [
        f"alias {route.alias}: {route.large} / {route.small}, mode {route.mode}, classifier "
        f"{report.kind} ({report.space})",
        f"  threshold in force {limits.base:.4f} ({source}); under pressure up to "
        f"{limits.in_force(True):.4f}",
        f"  decided by rules: {report.by_rules}",
        "                sent small  sent large",
        f"  easy          {matrix.easy_small:>10}  {matrix.easy_large:>10}",
        f"  hard          {matrix.hard_small:>10}  {matrix.hard_large:>10}",
        f"  {shares(matrix)}",
    ]
    if report.wrong:
        lines.append("  hard prompts sent small (score, text):")
        lines.extend(f"    {value:.3f}  {text[:96]}" for value, text in report.wrong[:SHOWN])
        if len(report.wrong) > SHOWN:
            lines.append(f"    ... and {len(report.wrong) - SHOWN} more")
    lines.append(f"  threshold meeting a hard share of {report.target:g} on this data: "
                 f"{report.meeting:.4f} ({shares(report.at_meeting)})")
    if calibrate:
        lines.append(f"  calibrated threshold: {report.meeting:.4f}")
        lines.append(f"  config line (in the small_model entry with alias {route.alias}): "
                     f"threshold: {report.meeting:.4f}")
    return "\n".join(lines)
