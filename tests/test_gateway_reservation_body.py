"""What the gateway reads for the KV reservation: the body's length terms (vLLM's `min_tokens`
and `ignore_eos`), the reply's finish reason (a cut reply is learned as censored), and a stream's
token count handed to the gate as it passes each re-estimate point."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.exchange import length_terms
from gateway.proxy import completion_of
from gateway.sse import StreamObserver, finish_reason_of


@pytest.mark.parametrize(
    ("body", "terms"),
    [({}, (0, False)), ({"ignore_eos": True}, (0, True)), ({"ignore_eos": "true"}, (0, False)),
     ({"ignore_eos": 1}, (0, False)), ({"min_tokens": 200}, (200, False)),
     ({"min_tokens": True}, (0, False)), ({"min_tokens": -3}, (0, False)),
     ({"min_tokens": "9"}, (0, False)), ({"min_tokens": 64, "ignore_eos": True}, (64, True))],
    ids=["neither", "ignore-eos", "ignore-eos-string-is-not-true", "ignore-eos-one-is-not-true",
         "min-tokens", "min-tokens-bool-is-not-a-count", "min-tokens-negative-is-none",
         "min-tokens-string-is-none", "both"],
)
def test_the_bodys_length_terms(body: dict[str, Any], terms: tuple[int, bool]) -> None:
    assert length_terms(body) == terms


@pytest.mark.parametrize(
    ("answer", "reason"),
    [({"choices": [{"finish_reason": "length"}]}, "length"),
     ({"choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}]}, "stop"),
     ({"choices": [{"finish_reason": None}]}, None), ({"choices": []}, None), ({}, None),
     (None, None)],
    ids=["cut", "first-choice", "null", "no-choices", "no-choices-key", "no-answer"],
)
def test_a_whole_answers_finish_reason(answer: dict[str, Any] | None,
                                       reason: str | None) -> None:
    assert finish_reason_of(answer) == reason


def test_the_finish_reason_reaches_the_completion() -> None:
    done = completion_of({"completion_tokens": 32}, dispatched_at=0.0, first_token_at=None,
                         ended_at=1.0, finish_reason="length")
    assert (done.completion_tokens, done.finish_reason) == (32, "length")


def chunk(n: int) -> bytes:
    return b"".join(b'data: {"choices":[{"delta":{"content":"w"}}]}\n\n' for _ in range(n))


def test_the_observer_hands_the_token_count_over_at_each_point_the_gate_names() -> None:
    calls: list[int] = []
    points = iter([5, 12, None])

    def grow(emitted: int) -> int | None:
        calls.append(emitted)
        return next(points)

    observer = StreamObserver(lambda: 0.0, on_tokens=grow)
    for n in (1, 2, 3, 4, 10, 30):  # 1, 3, 6, 10, 20, 50 events so far
        observer.feed(chunk(n))
    assert calls == [1, 6, 20]  # first event, then past 5, then past 12; None: never again


def test_without_a_gate_hook_nothing_is_called_and_bytes_pass_unchanged() -> None:
    observer = StreamObserver(lambda: 0.0)
    assert observer.feed(chunk(3)) == chunk(3)
    assert observer.text_events == 3
