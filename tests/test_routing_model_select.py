"""Small-model routing's choice, as a table: an easy request (short prompt, short answer asked,
short conversation, no hard marker) goes to the small model (mode easy), or only while the large
model is busy (mode overflow); anything else, or no small backend, goes to the large model."""

from __future__ import annotations

import pytest

from routing.model_select import (
    CHARS_PER_TOKEN,
    Ask,
    Selection,
    SmallModelRoute,
    large_busy,
    select,
)
from routing.state import BackendSnapshot, BackendSpec, Candidate

ROUTE = SmallModelRoute(alias="auto", large="big", small="tiny", max_prompt_tokens=100,
                        max_output_tokens=200, max_turns=3)
OVERFLOW = SmallModelRoute(alias="auto", large="big", small="tiny", mode="overflow")
EASY = Ask(text="What is the capital of France?", max_tokens=64, turns=1)


@pytest.mark.parametrize(
    ("ask", "expected"),
    [
        pytest.param(EASY, Selection("tiny", True, "easy"), id="an easy request goes small"),
        pytest.param(Ask("x" * (100 * CHARS_PER_TOKEN + 1), 64, 1),
                     Selection("big", False, "long_prompt"), id="a long prompt goes large"),
        pytest.param(Ask(EASY.text, 201, 1), Selection("big", False, "long_output"),
                     id="a long answer asked for goes large"),
        pytest.param(Ask(EASY.text, None, 1), Selection("big", False, "long_output"),
                     id="no max_tokens counts as a long answer"),
        pytest.param(Ask(EASY.text, 64, 4), Selection("big", False, "many_turns"),
                     id="a long conversation goes large"),
        pytest.param(Ask("Explain it Step By Step", 64, 1),
                     Selection("big", False, "hard_marker"), id="a hard marker, any case"),
        pytest.param(Ask("fix this:\n```py\nx = 1\n```", 64, 1),
                     Selection("big", False, "hard_marker"), id="code goes large"),
    ],
)
def test_mode_easy(ask: Ask, expected: Selection) -> None:
    assert select(ROUTE, ask, small_available=True) == expected


def test_an_easy_request_stays_large_when_no_backend_serves_the_small_model() -> None:
    assert select(ROUTE, EASY, small_available=False) == Selection("big", False,
                                                                   "small_unavailable")


@pytest.mark.parametrize(
    ("busy", "expected"),
    [
        pytest.param(False, Selection("big", False, "large_free"),
                     id="overflow: the large model serves while it has room"),
        pytest.param(True, Selection("tiny", True, "overflow"),
                     id="overflow: easy requests spill to the small model while it is busy"),
    ],
)
def test_mode_overflow(busy: bool, expected: Selection) -> None:
    assert select(OVERFLOW, EASY, small_available=True, busy=busy) == expected


def test_overflow_never_spills_a_hard_request() -> None:
    assert select(OVERFLOW, Ask("prove it", 64, 1), small_available=True, busy=True).small is False


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
