"""Small-model routing's choice, as tables. Rules first: a pinned request, tools, a
response_format, a prompt past the small model's window, more output than allowed, many turns or
a hard marker (whole words only) send a request large for certain. Then the classifier's score
decides against the threshold in force (raised under pressure, never past the ceiling): easy
goes small (mode easy), small only while the large model is busy (mode overflow), or nowhere but
large (mode shadow, which reports the verdict)."""

from __future__ import annotations

import pytest

from routing.difficulty.calibrate import Thresholds
from routing.model_select import (
    CHARS_PER_TOKEN,
    Ask,
    Selection,
    SmallModelRoute,
    certain,
    large_busy,
    select,
)
from routing.state import BackendSnapshot, BackendSpec, Candidate

ROUTE = SmallModelRoute(alias="auto", large="big", small="tiny", max_prompt_tokens=100,
                        max_output_tokens=200, max_turns=3)
OVERFLOW = SmallModelRoute(alias="auto", large="big", small="tiny", mode="overflow")
SHADOW = SmallModelRoute(alias="auto", large="big", small="tiny", mode="shadow")
EASY = Ask(text="What is the capital of France?", max_tokens=64, turns=1)
THRESHOLDS = Thresholds(base=0.3, step=0.1, ceiling=0.35)


@pytest.mark.parametrize(
    ("ask", "rule"),
    [
        pytest.param(EASY, None, id="nothing certain: the classifier decides"),
        pytest.param(Ask(EASY.text, None, 1), None,
                     id="no max_tokens is not a long answer: the classifier decides"),
        pytest.param(Ask(EASY.text, 64, 1, pinned_large=True), "pinned",
                     id="the pin header sends it large"),
        pytest.param(Ask(EASY.text, 64, 1, tools=True), "tools", id="tools send it large"),
        pytest.param(Ask(EASY.text, 64, 1, response_format=True), "response_format",
                     id="a response_format sends it large"),
        pytest.param(Ask("x" * (100 * CHARS_PER_TOKEN + 1), 64, 1), "long_prompt",
                     id="a prompt past the small window goes large"),
        pytest.param(Ask(EASY.text, 201, 1), "long_output",
                     id="more output than the alias allows goes large"),
        pytest.param(Ask(EASY.text, 64, 4), "many_turns", id="a long conversation goes large"),
        pytest.param(Ask("Explain it Step By Step", 64, 1), "hard_marker",
                     id="a hard marker, any case"),
        pytest.param(Ask("fix this:\n```py\nx = 1\n```", 64, 1), "hard_marker",
                     id="a code fence is a marker"),
        pytest.param(Ask("Prove it.", 64, 1), "hard_marker", id="a marker as a whole word"),
        pytest.param(Ask("How can I improve my handwriting?", 64, 1), None,
                     id="improve does not match the marker prove"),
        pytest.param(Ask("Please proofread this line.", 64, 1), None,
                     id="proofread does not match the marker proof"),
        pytest.param(Ask("Is this jacket waterproof?", 64, 1), None,
                     id="waterproof does not match the marker proof"),
    ],
)
def test_rules(ask: Ask, rule: str | None) -> None:
    assert certain(ROUTE, ask) == rule


@pytest.mark.parametrize(
    ("markers", "text", "rule"),
    [
        pytest.param(("legal",), "Is it illegal to jaywalk?", None,
                     id="a marker never matches inside a word"),
        pytest.param(("legal",), "Is this legal?", "hard_marker", id="but does as a word"),
        pytest.param((r"re:\d+\s*\^\s*\d+",), "what is 3 ^ 47", "hard_marker",
                     id="re: starts a regular expression"),
        pytest.param((), "Prove it.", None, id="no markers: none match"),
    ],
)
def test_markers(markers: tuple[str, ...], text: str, rule: str | None) -> None:
    route = SmallModelRoute(alias="auto", large="big", small="tiny", hard_markers=markers)
    assert certain(route, Ask(text, 64, 1)) == rule


@pytest.mark.parametrize(
    ("score", "busy", "expected"),
    [
        pytest.param(0.1, False, Selection("tiny", True, "easy", 0.1, 0.3),
                     id="a score below the threshold goes small"),
        pytest.param(0.3, False, Selection("big", False, "hard", 0.3, 0.3),
                     id="a score at the threshold goes large"),
        pytest.param(0.33, True, Selection("tiny", True, "easy", 0.33, 0.35),
                     id="under pressure the threshold rises, to the ceiling"),
        pytest.param(0.36, True, Selection("big", False, "hard", 0.36, 0.35),
                     id="but never past it"),
    ],
)
def test_mode_easy(score: float, busy: bool, expected: Selection) -> None:
    assert select(ROUTE, EASY, score, THRESHOLDS, small_available=True, busy=busy) == expected


def test_a_rule_decides_before_the_score() -> None:
    pinned = Ask(EASY.text, 64, 1, pinned_large=True)
    assert select(ROUTE, pinned, None, THRESHOLDS, small_available=True) == Selection(
        "big", False, "pinned")


def test_without_a_rule_the_score_is_needed() -> None:
    with pytest.raises(ValueError, match="score"):
        select(ROUTE, EASY, None, THRESHOLDS, small_available=True)


def test_an_easy_request_stays_large_when_no_backend_serves_the_small_model() -> None:
    assert select(ROUTE, EASY, 0.1, THRESHOLDS, small_available=False) == Selection(
        "big", False, "small_unavailable", 0.1, 0.3)


@pytest.mark.parametrize(
    ("busy", "expected"),
    [
        pytest.param(False, Selection("big", False, "large_free", 0.1, 0.3),
                     id="overflow: the large model serves while it has room"),
        pytest.param(True, Selection("tiny", True, "overflow", 0.1, 0.35),
                     id="overflow: easy requests spill to the small model while it is busy"),
    ],
)
def test_mode_overflow(busy: bool, expected: Selection) -> None:
    assert select(OVERFLOW, EASY, 0.1, THRESHOLDS, small_available=True, busy=busy) == expected


def test_overflow_never_spills_a_hard_request() -> None:
    assert select(OVERFLOW, EASY, 0.9, THRESHOLDS, small_available=True, busy=True).small is False


@pytest.mark.parametrize(
    ("score", "reason"),
    [
        pytest.param(0.1, "shadow:easy", id="shadow: an easy verdict is reported, not acted on"),
        pytest.param(0.9, "shadow:hard", id="shadow: and a hard one"),
    ],
)
def test_mode_shadow_decides_without_acting(score: float, reason: str) -> None:
    assert select(SHADOW, EASY, score, THRESHOLDS, small_available=True) == Selection(
        "big", False, reason, score, 0.3)


@pytest.mark.parametrize(
    ("selection", "header"),
    [
        pytest.param(Selection("big", False, "tools"), "tools", id="a rule is named alone"),
        pytest.param(Selection("tiny", True, "easy", 0.12345, 0.3),
                     "easy; score=0.123; threshold=0.300",
                     id="a verdict carries its score and the threshold in force"),
    ],
)
def test_the_reason_header(selection: Selection, header: str) -> None:
    assert selection.header == header


def candidate(waiting: int | None, kv_usage: float | None, *, stale: bool = False,
              scraped: bool = True) -> Candidate:
    snapshot = BackendSnapshot(taken_at=0.0, format="vllm", kv_usage=kv_usage, waiting=waiting)
    return Candidate(spec=BackendSpec(id="b", url="http://b"), healthy=True,
                     snapshot=snapshot if scraped else None, stale=stale, inflight=0,
                     reserved_blocks=0)


@pytest.mark.parametrize(
    ("candidates", "queued", "busy"),
    [
        pytest.param([candidate(0, 0.5)], 0, False, id="room on a backend: not busy"),
        pytest.param([candidate(0, 0.5)], 1, True, id="requests queued in the gateway: busy"),
        pytest.param([candidate(2, 0.5)], 0, True, id="the only backend has waiting: busy"),
        pytest.param([candidate(0, 0.95)], 0, True, id="KV at the high-water mark: busy"),
        pytest.param([candidate(2, 0.5), candidate(0, 0.2)], 0, False,
                     id="one backend of two with room: not busy"),
        pytest.param([candidate(2, 0.95, stale=True)], 0, False,
                     id="a stale snapshot is not evidence of load"),
        pytest.param([candidate(None, None, scraped=False)], 0, False,
                     id="a backend never scraped counts as having room"),
        pytest.param([], 0, True, id="no healthy backend: busy"),
    ],
)
def test_large_busy(candidates: list[Candidate], queued: int, busy: bool) -> None:
    assert large_busy(candidates, queued, high_water=0.9) is busy
