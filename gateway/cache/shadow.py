"""Shadow mode's record: the semantic hits the cache would have served, and whether they were right.

With `cache.semantic: shadow`, a semantic candidate that passed the threshold and the guard is not
served: the request goes to a backend as a miss. Once its own answer is known, one record is kept
in the store (the newest `store.SHADOW_RECORDS`, shared by replicas with Redis): the similarity,
both questions' sha256, both answers (for inspection), and whether they agreed: identical texts,
or their embeddings at cosine `AGREEMENT` or more. A request whose answer never came whole is
recorded with `agreed` null, and counts in no precision (so is one whose answers differ in text
while the embedder could not embed them).

`report(records)` is precision per similarity band: of the would-be hits whose outcome is known,
the share whose answers agreed. Pure: records in, rows out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

AGREEMENT = 0.95  # the answers' cosine at which two different texts agree
BANDS = (0.8, 0.85, 0.9, 0.95, 0.98)  # lower edges; the last band runs to 1.0


@dataclass(frozen=True, slots=True)
class Shadowed:
    """A semantic hit shadow mode did not serve."""

    cached_id: str
    similarity: float
    cached_question: str
    question: str
    cached_answer: str


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def agreed(cached_answer: str, answer: str | None, answers_cosine: float | None) -> bool | None:
    """Whether the two answers agree; None when the second never came, or differs in text and
    could not be embedded (the embedder failing open)."""
    if answer is None:
        return None
    if answer == cached_answer:
        return True
    return None if answers_cosine is None else answers_cosine >= AGREEMENT


def shadow_record(shadowed: Shadowed, answer: str | None, answers_cosine: float | None, *,
                  at: float) -> bytes:
    """The record of one shadow hit, as a store keeps it (JSON)."""
    return orjson.dumps({
        "at": at, "similarity": shadowed.similarity, "cached_id": shadowed.cached_id,
        "question_sha256": digest(shadowed.question),
        "cached_question_sha256": digest(shadowed.cached_question),
        "agreed": agreed(shadowed.cached_answer, answer, answers_cosine),
        "answers_cosine": answers_cosine, "answer": answer,
        "cached_answer": shadowed.cached_answer,
    })


def decoded(raw: bytes) -> dict[str, Any] | None:
    """A record `shadow_record` wrote; None for anything else (skipped by the report)."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("similarity"), int | float):
        return None
    return record


@dataclass(frozen=True, slots=True)
class Band:
    low: float
    high: float
    would_hit: int  # records in the band
    known: int  # of them, with the second answer known
    agreed: int

    @property
    def precision(self) -> float | None:
        return self.agreed / self.known if self.known else None


def report(records: Iterable[dict[str, Any]], bands: Sequence[float] = BANDS) -> list[Band]:
    """Precision per similarity band; a similarity under the lowest edge counts in the lowest."""
    edges = sorted(bands)
    counts = [[0, 0, 0] for _ in edges]
    for record in records:
        similarity = float(record["similarity"])
        slot = max((i for i, low in enumerate(edges) if similarity >= low), default=0)
        counts[slot][0] += 1
        if record.get("agreed") is not None:
            counts[slot][1] += 1
            counts[slot][2] += record["agreed"] is True
    highs = [*edges[1:], 1.0]
    return [Band(low, high, *count) for low, high, count in zip(edges, highs, counts, strict=True)]


def render(rows: Sequence[Band]) -> str:
    """The report as the shadow-report command prints it."""
    lines = [f"{'similarity':<14}{'would hit':>10}{'known':>8}{'agreed':>8}{'precision':>11}"]
    for band in rows:
        precision = "-" if band.precision is None else f"{band.precision:.3f}"
        lines.append(f"{f'[{band.low:.2f}, {band.high:.2f}' + (']' if band.high >= 1 else ')'):<14}"
                     f"{band.would_hit:>10}{band.known:>8}{band.agreed:>8}{precision:>11}")
    known = sum(band.known for band in rows)
    total = sum(band.agreed for band in rows)
    overall = "-" if not known else f"{total / known:.3f}"
    lines.append(f"{'all':<14}{sum(b.would_hit for b in rows):>10}{known:>8}{total:>8}"
                 f"{overall:>11}")
    return "\n".join(lines) + "\n"
