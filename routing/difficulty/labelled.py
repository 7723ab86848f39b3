"""The labelled prompts file: one JSON object a line, `text`, `label` (easy | hard), `domain`,
`split` (train | eval)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    hard: bool
    domain: str
    split: str


def read_prompts(text: str) -> list[Prompt]:
    """The prompts of a labelled file's text (ValueError naming the line of a bad one)."""
    prompts: list[Prompt] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            label, split = row["label"], row.get("split", "eval")
            if label not in ("easy", "hard") or split not in ("train", "eval"):
                raise ValueError("label must be easy or hard, split train or eval")
            prompts.append(Prompt(text=str(row["text"]), hard=label == "hard",
                                  domain=str(row.get("domain", "")), split=split))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {number}: {exc}") from exc
    return prompts
