"""How well the semantic tier tells same-answer questions from near misses, on labelled pairs.

A pair is two questions, whether one's answer serves the other (`same`), and its `kind`: the
same-answer kinds (`paraphrase`, `surface`), the near-miss kinds the guard covers (its `KINDS`)
and the labels of `NEAR_MISS_LABELS`. A pair is a hit when the cosine of its two embeddings is
at or above the threshold and, with the guard on, the guard lets it through. Precision is the
share of hits that are same-answer pairs; recall the share of same-answer pairs that hit.

`evaluate` and `sweep` are pure: they take the similarities (`similarities` computes them with an
embedder, the only step that awaits) and return figures. `tests/data/cache_pairs.jsonl` is the
project's own set; a third of it is marked `holdout`, kept apart while the guard was written.
`tests/data/cache_pairs_fresh.jsonl` (`FRESH`) was written afterwards, apart from the guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from gateway.cache import guard
from gateway.cache.vectors import cosine

if TYPE_CHECKING:
    from gateway.cache.embedders.hashing import HashingEmbedder
    from gateway.cache.embedders.local import LocalEmbedder
    from gateway.cache.embedders.remote import RemoteEmbedder

SAME_KINDS = ("paraphrase", "surface")
# Near misses labelled by what differs in words rather than by the check that vetoes them
# (`tests/data/cache_pairs_fresh.jsonl`): "two" vs "three", faster/slower, before/after,
# Python 2 vs 3, in Rust vs in Go, one file vs several, A owes B vs B owes A, paths and flags,
# people and places.
NEAR_MISS_LABELS = ("quantity", "comparative", "temporal", "version", "programming", "plural",
                    "role", "path", "person", "place")
KINDS = (*SAME_KINDS, *guard.KINDS, *NEAR_MISS_LABELS)
SPLITS = ("dev", "holdout")
DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "cache_pairs.jsonl"
FRESH = DATA.with_name("cache_pairs_fresh.jsonl")
SWEEP = (0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


@dataclass(frozen=True, slots=True)
class Pair:
    kind: str
    same: bool
    a: str
    b: str
    split: str = "dev"


@dataclass(frozen=True, slots=True)
class Scored:
    pair: Pair
    similarity: float
    veto: guard.Veto | None  # the guard's verdict on the pair (whatever its similarity)


@dataclass(frozen=True, slots=True)
class Figures:
    """One row of a report: the pairs of one kind (or all of them) at one threshold."""

    kind: str
    pairs: int
    same: int  # same-answer pairs among them
    above: int  # pairs at or above the threshold, before the guard
    hits: int  # pairs served: above, and let through by the guard when it is on
    true_hits: int
    vetoed: int  # above the threshold, vetoed by the guard
    wrong_vetoes: int  # of those, same-answer pairs

    @property
    def false_hits(self) -> int:
        return self.hits - self.true_hits

    @property
    def precision(self) -> float | None:
        return self.true_hits / self.hits if self.hits else None

    @property
    def recall(self) -> float | None:
        return self.true_hits / self.same if self.same else None


def load_pairs(path: Path = DATA) -> list[Pair]:
    """The pairs of a JSON-lines file; ValueError naming the line of a malformed one."""
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            pair = Pair(kind=str(row["kind"]), same=bool(row["same"]), a=str(row["a"]),
                        b=str(row["b"]), split=str(row.get("split", "dev")))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a pair ({type(exc).__name__}: {exc})"
                             ) from exc
        if pair.kind not in KINDS:
            raise ValueError(f"{path}:{number}: unknown kind {pair.kind!r}")
        if pair.same != (pair.kind in SAME_KINDS):
            raise ValueError(f"{path}:{number}: a {pair.kind} pair has same={pair.same}")
        pairs.append(pair)
    return pairs


def scored(pairs: Sequence[Pair], similarities: Sequence[float]) -> list[Scored]:
    """Each pair with its similarity and the guard's verdict."""
    if len(pairs) != len(similarities):
        raise ValueError(f"{len(pairs)} pairs, {len(similarities)} similarities")
    return [Scored(pair, similarity, guard.veto(pair.a, pair.b))
            for pair, similarity in zip(pairs, similarities, strict=True)]


def evaluate(rows: Iterable[Scored], threshold: float, *,
             use_guard: bool = True) -> list[Figures]:
    """One row per kind present, in `KINDS` order, then the same-answer pairs together
    (`same-answer`) and every pair (`all`)."""
    rows = list(rows)
    groups = [(kind, [row for row in rows if row.pair.kind == kind]) for kind in KINDS]
    report = [_figures(kind, members, threshold, use_guard) for kind, members in groups
              if members]
    report.append(_figures("same-answer", [row for row in rows if row.pair.same], threshold,
                           use_guard))
    report.append(_figures("all", rows, threshold, use_guard))
    return report


def sweep(rows: Iterable[Scored], thresholds: Sequence[float] = SWEEP, *,
          use_guard: bool = True) -> list[Figures]:
    """Every pair's figures at each threshold (kind = the threshold)."""
    rows = list(rows)
    return [_figures(f"{threshold:g}", rows, threshold, use_guard) for threshold in thresholds]


def _figures(kind: str, rows: Sequence[Scored], threshold: float, use_guard: bool) -> Figures:
    above = [row for row in rows if row.similarity >= threshold]
    vetoed = [row for row in above if row.veto is not None] if use_guard else []
    hits = [row for row in above if not use_guard or row.veto is None]
    return Figures(kind=kind, pairs=len(rows), same=sum(row.pair.same for row in rows),
                   above=len(above), hits=len(hits),
                   true_hits=sum(row.pair.same for row in hits), vetoed=len(vetoed),
                   wrong_vetoes=sum(row.pair.same for row in vetoed))


async def similarities(embedder: HashingEmbedder | LocalEmbedder | RemoteEmbedder,
                       pairs: Sequence[Pair], *, batch: int = 64) -> list[float]:
    """The cosine of each pair's two embeddings; ValueError when the embedder cannot answer."""
    texts = [text for pair in pairs for text in (pair.a, pair.b)]
    found: list[float] = []
    for start in range(0, len(texts), batch):
        vectors = await embedder.embed(texts[start:start + batch])
        if vectors is None:
            raise ValueError(f"the embedder {embedder.name} did not answer")
        if isinstance(vectors, list):
            found.extend(cosine(vectors[index], vectors[index + 1])
                         for index in range(0, len(vectors), 2))
        else:
            found.extend(float(value) for value in (vectors[0::2] * vectors[1::2]).sum(axis=1))
    return found


def render(report: Sequence[Figures], title: str) -> str:
    """A report as a plain-text table."""
    lines = [title, f"{'kind':<12} {'pairs':>5} {'same':>5} {'above':>5} {'vetoed':>6}"
                    f" {'hits':>5} {'false':>5} {'precision':>9} {'recall':>6}"]
    for row in report:
        lines.append(f"{row.kind:<12} {row.pairs:>5} {row.same:>5} {row.above:>5}"
                     f" {row.vetoed:>6} {row.hits:>5} {row.false_hits:>5}"
                     f" {_ratio(row.precision):>9} {_ratio(row.recall):>6}")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
