"""The evaluation set is what it claims to be, the figures count what they say, and the semantic
tier meets its targets on the set: with the local model and the guard, precision at least 0.99
and recall at least 0.6 on same-answer pairs; with the hashing embedder and the guard, precision
at least 0.99 and recall at least 0.5 on surface variants. The targets hold on the whole set and
on each of its two splits (`holdout` was kept apart while the guard was written)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from gateway.cache import eval as evaluation
from gateway.cache import guard
from gateway.cache.embedders import choice
from gateway.cache.embedders.hashing import HashingEmbedder
from gateway.cache.embedders.local import LocalEmbedder
from gateway.cli import main

PAIRS = evaluation.load_pairs()

# The examples the issue quotes: the set is written apart from them.
QUOTED_IN_THE_ISSUE = ("JSON to YAML", "YAML to JSON", "rm -rf ./build", "rm -rf /build",
                       "contain gluten", "Boston", "reset my password", "Prove it")


def test_the_set_has_400_pairs_and_25_of_every_near_miss_kind() -> None:
    assert len(PAIRS) >= 400
    counts = Counter(pair.kind for pair in PAIRS)
    assert set(counts) == {*evaluation.SAME_KINDS, *guard.KINDS}
    assert all(counts[kind] >= 25 for kind in guard.KINDS), counts
    assert len({(pair.a, pair.b) for pair in PAIRS}) == len(PAIRS)
    assert all(pair.a != pair.b for pair in PAIRS)


def test_a_third_of_every_kind_is_held_out() -> None:
    for kind in (*evaluation.SAME_KINDS, *guard.KINDS):
        members = [pair for pair in PAIRS if pair.kind == kind]
        held = sum(pair.split == "holdout" for pair in members)
        assert abs(held - len(members) / 3) <= 1, kind


def test_none_of_the_issues_examples_is_in_the_set() -> None:
    for pair in PAIRS:
        for example in QUOTED_IN_THE_ISSUE:
            assert example.casefold() not in (pair.a + " " + pair.b).casefold(), pair


@pytest.mark.parametrize(("line", "message"), [
    ('{"kind": "number", "same": false, "a": "x"}', "not a pair"),
    ('{"kind": "weather", "same": false, "a": "x", "b": "y"}', "unknown kind"),
    ('{"kind": "number", "same": true, "a": "x", "b": "y"}', "same=True"),
    ("not json", "not a pair"),
])
def test_a_malformed_line_is_named(line: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"kind": "surface", "same": true, "a": "x", "b": "X"}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"pairs.jsonl:2: .*{message}"):
        evaluation.load_pairs(path)


def test_the_figures_count_hits_vetoes_and_misses() -> None:
    pairs = [evaluation.Pair("surface", True, "What is 2?", "what is 2"),
             evaluation.Pair("surface", True, "Where is Oslo?", "where is oslo"),
             evaluation.Pair("number", False, "What is 2?", "What is 3?"),
             evaluation.Pair("entity", False, "Where is Oslo?", "Where is Bergen?")]
    rows = evaluation.scored(pairs, [0.99, 0.5, 0.99, 0.95])
    by_kind = {row.kind: row for row in evaluation.evaluate(rows, 0.9)}
    assert by_kind["surface"].hits == 1 and by_kind["surface"].recall == 0.5
    assert by_kind["number"].vetoed == 1 and by_kind["number"].hits == 0
    assert by_kind["all"].precision == 1.0 and by_kind["all"].false_hits == 0
    unguarded = {row.kind: row for row in evaluation.evaluate(rows, 0.9, use_guard=False)}
    assert unguarded["all"].hits == 3 and unguarded["all"].precision == pytest.approx(1 / 3)
    swept = evaluation.sweep(rows, (0.4, 0.96))
    assert [row.hits for row in swept] == [2, 1]
    assert [row.kind for row in swept] == ["0.4", "0.96"]


@pytest.fixture(scope="module")
def similarities() -> dict[str, list[float]]:
    return {"hashing": asyncio.run(evaluation.similarities(HashingEmbedder(), PAIRS)),
            "local": asyncio.run(evaluation.similarities(LocalEmbedder(), PAIRS))}


def figures(similarities: dict[str, list[float]], embedder: str, split: str
            ) -> dict[str, evaluation.Figures]:
    chosen = [index for index, pair in enumerate(PAIRS) if split in ("all", pair.split)]
    rows = evaluation.scored([PAIRS[index] for index in chosen],
                             [similarities[embedder][index] for index in chosen])
    threshold = choice.THRESHOLDS[choice.resolve(embedder, True)]
    return {row.kind: row for row in evaluation.evaluate(rows, threshold)}


@pytest.mark.parametrize("split", ["all", "dev", "holdout"])
def test_the_local_model_with_the_guard_meets_its_targets(
        similarities: dict[str, list[float]], split: str) -> None:
    report = figures(similarities, "local", split)
    assert report["all"].precision is not None and report["all"].precision >= 0.99
    assert report["same-answer"].recall is not None and report["same-answer"].recall >= 0.6


@pytest.mark.parametrize("split", ["all", "dev", "holdout"])
def test_the_hashing_embedder_with_the_guard_meets_its_targets(
        similarities: dict[str, list[float]], split: str) -> None:
    report = figures(similarities, "hashing", split)
    assert report["all"].precision is not None and report["all"].precision >= 0.99
    assert report["surface"].recall is not None and report["surface"].recall >= 0.5


def test_without_the_guard_the_model_serves_near_misses(
        similarities: dict[str, list[float]]) -> None:
    rows = evaluation.scored(PAIRS, similarities["local"])
    report = {row.kind: row for row in evaluation.evaluate(
        rows, choice.THRESHOLDS[choice.Kind.LOCAL], use_guard=False)}
    assert report["all"].false_hits > 50  # what the guard is for


def test_the_command_prints_each_kind_and_the_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "eval", "--embedder", "hashing", "--split", "holdout"]) == 0
    out = capsys.readouterr().out
    assert "hashing-v1, with the guard, threshold 0.9" in out
    for kind in (*evaluation.SAME_KINDS, *guard.KINDS, "same-answer", "all"):
        assert f"\n{kind} " in out
    assert "threshold sweep" in out and "\n0.95 " in out


def test_the_command_names_a_bad_data_file(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


FRESH = evaluation.load_pairs(evaluation.FRESH)


@pytest.mark.parametrize("embedder", ["local", "hashing"])
def test_on_the_set_written_apart_from_the_guard_no_near_miss_is_served(embedder: str) -> None:
    model = LocalEmbedder() if embedder == "local" else HashingEmbedder()
    rows = evaluation.scored(FRESH, asyncio.run(evaluation.similarities(model, FRESH)))
    report = {row.kind: row for row in evaluation.evaluate(
        rows, choice.THRESHOLDS[choice.resolve(embedder, True)])}
    assert report["all"].false_hits == 0, [
        row.kind for row in report.values() if row.false_hits]
    assert report["surface"].recall is not None and report["surface"].recall >= 0.5
    if embedder == "local":
        assert report["same-answer"].recall is not None and report["same-answer"].recall >= 0.6


def test_the_fresh_set_labels_every_kind_of_near_miss() -> None:
    counts = Counter(pair.kind for pair in FRESH)
    assert set(counts) == set(evaluation.KINDS)
    assert len(FRESH) >= 150 and all(counts[label] >= 5 for label in evaluation.NEAR_MISS_LABELS)
