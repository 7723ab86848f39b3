"""The classifier weights kvgate ships (`data/<kind>.json`), and their JSON form.

The files are written by `scripts/train_router.py`; floats are stored as Python writes them
(shortest repr), so a file read back is the exact weights that were written.
"""

from __future__ import annotations

import importlib.resources
import json
from functools import cache
from typing import Any

from routing.difficulty.model import Kind, Weights

FIELDS = ("kind", "space", "dimensions", "bias", "cheap_mean", "cheap_scale", "cheap_weights",
          "vector_weights", "hard_scores", "easy_scores")


def to_json(weights: Weights, meta: dict[str, Any]) -> str:
    """The file's text: `meta` (how it was trained) beside the weights."""
    body: dict[str, Any] = {"meta": meta}
    for field in FIELDS:
        value = getattr(weights, field)
        body[field] = list(value) if isinstance(value, tuple) else value
    return json.dumps(body, indent=None, separators=(",", ":")) + "\n"


def from_json(text: str) -> Weights:
    body = json.loads(text)
    kind: Kind = body["kind"]
    if kind not in ("minilm", "hashed"):
        raise ValueError(f"unknown classifier kind {kind!r}")
    return Weights(
        kind=kind, space=str(body["space"]), dimensions=int(body["dimensions"]),
        bias=float(body["bias"]),
        **{field: tuple(float(v) for v in body[field]) for field in FIELDS[4:]},
    )


def shipped_path(kind: Kind) -> str:
    return str(importlib.resources.files("routing.difficulty") / "data" / f"{kind}.json")


@cache
def shipped(kind: Kind) -> Weights:
    """The shipped weights of `kind` (read once)."""
    with open(shipped_path(kind), encoding="utf-8") as file:
        return from_json(file.read())
