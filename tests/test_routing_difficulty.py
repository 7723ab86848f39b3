"""The difficulty classifier's parts, as specifications: the cheap features read what they name,
a threshold for a share sends at most that share of the calibration hard prompts small, the
confusion matrix counts what it says, the shipped weights read back exactly, and the labelled
files are what the classifier may be trained and judged on."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from routing.difficulty.calibrate import (
    ALWAYS_HARD,
    NEVER_HARD,
    Thresholds,
    conservative_threshold,
    share_below,
    threshold_for_share,
    thresholds,
    wilson_upper,
)
from routing.difficulty.cues import CUE_NAMES, counts
from routing.difficulty.evaluate import Confusion, confusion, meeting
from routing.difficulty.features import CHEAP_NAMES, cheap, hashed
from routing.difficulty.labelled import read_prompts
from routing.difficulty.model import score
from routing.difficulty.weights import from_json, shipped, shipped_path, to_json

DATA = Path(__file__).parent / "data"


def feature(text: str, name: str) -> float:
    return cheap(text)[CHEAP_NAMES.index(name)]


@pytest.mark.parametrize(
    ("text", "name", "other"),
    [
        pytest.param("what is 3^47 mod 11", "log_operators", "what is the capital",
                     id="operators count ^ and mod"),
        pytest.param("is 1,000,000,007 prime", "log_longest_number", "is 17 prime",
                     id="the longest number reads through its commas"),
        pytest.param("def f(x): return {x: 1};", "log_code_marks", "define the word",
                     id="code marks count keywords and braces, not words containing them"),
        pytest.param("how are you?", "question_mark", "how are you",
                     id="a question mark"),
        pytest.param("write a compiler", "imperative", "a compiler, please",
                     id="an imperative first word"),
        pytest.param("こんにちは", "non_ascii_share", "hello", id="non-ASCII text"),
    ],
)
def test_cheap_features(text: str, name: str, other: str) -> None:
    assert feature(text, name) > feature(other, name)


def test_hashed_features_are_unit_length_and_stable() -> None:
    vector = hashed("Write a B-tree in Java")
    assert sum(value * value for value in vector.values()) == pytest.approx(1.0)
    assert vector == hashed("write a b-tree in JAVA")
    assert hashed("") == {}


HARD = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995)


@pytest.mark.parametrize(
    ("share", "threshold"),
    [
        pytest.param(0.0, 0.2, id="share 0: below the lowest hard score"),
        pytest.param(0.05, 0.2, id="a share under one prompt rounds down"),
        pytest.param(0.1, 0.4, id="one prompt in ten may go small"),
        pytest.param(0.25, 0.6, id="two and a half rounds down to two"),
        pytest.param(1.0, NEVER_HARD, id="every hard prompt may: above every score"),
    ],
)
def test_threshold_for_share(share: float, threshold: float) -> None:
    assert threshold_for_share(HARD, share) == threshold
    assert share_below(HARD, threshold) <= share


def test_no_calibration_scores_send_everything_large() -> None:
    assert threshold_for_share((), 0.05) == ALWAYS_HARD


@pytest.mark.parametrize(
    ("limits", "pressure", "in_force"),
    [
        pytest.param(Thresholds(0.3, 0.1, 0.5), False, 0.3, id="no pressure: the base"),
        pytest.param(Thresholds(0.3, 0.1, 0.5), True, pytest.approx(0.4),
                     id="pressure: the base plus the step"),
        pytest.param(Thresholds(0.3, 0.5, 0.5), True, 0.5, id="never past the ceiling"),
        pytest.param(Thresholds(0.6, 0.1, 0.5), True, 0.6,
                     id="a base above the ceiling is not tightened under pressure"),
    ],
)
def test_thresholds_under_pressure(limits: Thresholds, pressure: bool, in_force: float) -> None:
    assert limits.in_force(pressure) == in_force


MANY = tuple(index / 1000 for index in range(1000))


def test_an_alias_threshold_overrides_its_share() -> None:
    own = thresholds(MANY, max_hard_share=0.05, threshold=0.7, step=0.05,
                     pressure_max_hard_share=0.1)
    assert own.base == 0.7 and own.ceiling == conservative_threshold(MANY, 0.1)
    shared = thresholds(MANY, max_hard_share=0.05, threshold=None, step=0.05,
                        pressure_max_hard_share=0.1)
    assert shared == Thresholds(base=conservative_threshold(MANY, 0.05), step=0.05,
                                ceiling=conservative_threshold(MANY, 0.1))


@pytest.mark.parametrize("share", [0.01, 0.05, 0.1])
def test_an_alias_calibrates_conservatively(share: float) -> None:
    # It lets fewer calibration hard prompts through than the share itself would, and as many
    # as keep the upper confidence bound of the share within it.
    threshold = conservative_threshold(MANY, share)
    allowed = round(share_below(MANY, threshold) * len(MANY))
    assert allowed < threshold_for_share(MANY, share) * len(MANY)
    assert wilson_upper(allowed, len(MANY)) <= share < wilson_upper(allowed + 1, len(MANY))


def test_a_small_calibration_set_sends_none_of_its_hard_prompts_small() -> None:
    # Ten hard prompts cannot show a 10% share is kept: the threshold sends none of them small.
    assert conservative_threshold(HARD, 0.1) == HARD[0]
    assert conservative_threshold((), 0.05) == ALWAYS_HARD


def cue(text: str, name: str) -> int:
    return counts(text.lower())[CUE_NAMES.index(name)]


@pytest.mark.parametrize(
    ("text", "name", "other"),
    [
        pytest.param("prove that it halts", "cue_proof", "how can I improve my essay",
                     id="proof cues are whole words: not inside improve"),
        pytest.param("is this clause enforceable", "cue_legal", "is jaywalking illegal",
                     id="legal cues: not inside illegal"),
        pytest.param("can I take fluconazole with lisinopril", "cue_medical", "see you in April",
                     id="drug-name endings, not a month"),
        pytest.param("where do I pay tax as a freelancer", "cue_finance", "a taxi to the airport",
                     id="finance cues: not inside taxi"),
        pytest.param("write a compiler", "cue_artifact", "write a haiku",
                     id="writing a big artifact, not a short text"),
        pytest.param("what is 3^47 mod 11", "cue_number_operator", "what is 47 in words",
                     id="numbers with operators"),
        pytest.param("is 1,000,000,007 prime", "cue_number_operator", "is 1,000 a lot",
                     id="a long number"),
        pytest.param("every group of order 15 is cyclic", "cue_math", "is this jacket waterproof",
                     id="math vocabulary"),
        pytest.param("hello, thanks!", "cue_easy", "hell", id="greetings and thanks"),
    ],
)
def test_cue_families_match_whole_words(text: str, name: str, other: str) -> None:
    assert cue(text, name) > 0 and cue(other, name) == 0


def test_confusion_counts_each_cell() -> None:
    scored = [(0.1, False), (0.9, False), (0.2, True), (0.8, True), (0.7, True)]
    result = confusion(scored, 0.5)
    assert result == Confusion(easy_small=1, easy_large=1, hard_small=1, hard_large=2)
    assert (result.hard_small_share, result.easy_small_share, result.small_share) == (
        pytest.approx(1 / 3), 0.5, 0.4)
    assert meeting(scored, 0.0) == 0.2


@pytest.mark.parametrize("kind", ["minilm", "hashed"])
def test_shipped_weights_read_back_exactly(kind: str) -> None:
    weights = shipped(kind)  # type: ignore[arg-type]
    assert from_json(to_json(weights, {})) == weights
    assert len(weights.vector_weights) == weights.dimensions
    assert list(weights.hard_scores) == sorted(weights.hard_scores)


@pytest.mark.parametrize(
    ("text", "hard"),
    [
        pytest.param("hi", False, id="a greeting is easy"),
        pytest.param("What is the capital of France?", False, id="a fact is easy"),
        pytest.param("show that every group of order 21 with a normal Sylow 7 is a semidirect "
                     "product, and classify them", True, id="a proof is hard"),
    ],
)
def test_the_hashed_classifier_scores_from_the_text_alone(text: str, hard: bool) -> None:
    weights = shipped("hashed")
    threshold = threshold_for_share(weights.hard_scores, 0.05)
    assert (score(weights, text) >= threshold) is hard


def test_the_minilm_classifier_needs_the_embedding() -> None:
    with pytest.raises(ValueError, match="embedding"):
        score(shipped("minilm"), "hi")


PROMPTS = read_prompts((DATA / "routing_prompts.jsonl").read_text(encoding="utf-8"))
ISSUE = read_prompts((DATA / "routing_prompts_reported.jsonl").read_text(encoding="utf-8"))
HELD_OUT = read_prompts((DATA / "routing_prompts_heldout.jsonl").read_text(encoding="utf-8"))


def test_the_labelled_set_is_large_and_balanced_in_every_domain() -> None:
    assert len(PROMPTS) >= 400
    labels = Counter((prompt.domain, prompt.hard) for prompt in PROMPTS)
    domains = {prompt.domain for prompt in PROMPTS}
    assert len(domains) >= 8
    assert all(labels[domain, True] >= 15 and labels[domain, False] >= 15 for domain in domains)


def test_the_eval_split_is_a_third_of_every_domain_and_label() -> None:
    cells = Counter((prompt.domain, prompt.hard) for prompt in PROMPTS)
    held = Counter((prompt.domain, prompt.hard) for prompt in PROMPTS if prompt.split == "eval")
    assert all(held[cell] >= 0.3 * count for cell, count in cells.items())
    texts = [prompt.text for prompt in PROMPTS]
    assert len(set(texts)) == len(texts)  # a prompt is in one split only


def test_the_held_out_prompts_are_not_in_the_labelled_set() -> None:
    texts = {prompt.text.lower() for prompt in PROMPTS}
    for held in (ISSUE, HELD_OUT):
        assert held and not any(prompt.text.lower() in texts for prompt in held)
    assert len(HELD_OUT) >= 100 and {prompt.split for prompt in HELD_OUT} == {"eval"}


def test_hard_prompts_include_short_ones_and_easy_ones_include_marker_lookalikes() -> None:
    short_hard = [p for p in PROMPTS if p.hard and len(p.text) <= 40]
    assert len(short_hard) >= 30
    lookalikes = ("improve", "waterproof", "illegal", "proofread")
    easy = " ".join(p.text.lower() for p in PROMPTS if not p.hard)
    assert all(word in easy for word in lookalikes)


def test_a_bad_line_is_named() -> None:
    with pytest.raises(ValueError, match="line 2"):
        read_prompts('{"text": "a", "label": "easy"}\n{"text": "b", "label": "medium"}\n')


def test_the_shipped_weights_name_the_data_they_were_trained_on() -> None:
    meta = json.loads(Path(shipped_path("hashed")).read_text())["meta"]
    assert meta["split"] == "train"
    assert meta["prompts"] == sum(prompt.split == "train" for prompt in PROMPTS)
