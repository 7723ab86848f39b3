"""The SSE relay's observer: bytes pass through unchanged, whole lines at a time, and the facts the
gateway records (first token time, finish reason, usage, errors, [DONE]) are read off cheaply."""

from __future__ import annotations

import itertools

import orjson
import pytest

from gateway.proxy import completion_of
from gateway.sse import DONE_EVENT, StreamObserver, error_event
from tests.paths import FIXTURES


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


class Ticks:
    """A clock that advances one tick per reading."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)

    def __call__(self) -> float:
        return float(next(self.counter))


def relay(data: bytes, piece: int, *, strip_usage: bool = False
          ) -> tuple[bytes, StreamObserver, list[bytes]]:
    observer = StreamObserver(Ticks(), strip_usage=strip_usage)
    outputs = [observer.feed(data[i : i + piece]) for i in range(0, len(data), piece)]
    outputs.append(observer.finish())
    return b"".join(outputs), observer, outputs


SPLITS = [pytest.param(1, id="one byte at a time"), pytest.param(7, id="7-byte pieces"),
          pytest.param(10**6, id="all at once")]


@pytest.mark.parametrize("piece", SPLITS)
def test_stream_bytes_pass_through_unchanged_however_they_are_split(piece: int) -> None:
    data = fixture("vllm-chat-stream.sse")
    out, observer, _ = relay(data, piece)
    assert out == data
    assert observer.finish_reason == "stop"
    assert observer.usage == {"prompt_tokens": 21, "total_tokens": 28, "completion_tokens": 7}
    assert observer.done and observer.complete
    assert observer.error is None


@pytest.mark.parametrize("piece", SPLITS)
def test_the_usage_event_the_client_did_not_ask_for_is_dropped_and_still_read(piece: int) -> None:
    data = fixture("vllm-chat-stream.sse")
    events = data.split(b"\n\n")
    usage_event = next(e for e in events if b'"usage"' in e)
    out, observer, _ = relay(data, piece, strip_usage=True)
    assert out == data.replace(usage_event + b"\n\n", b"")
    assert observer.usage == {"prompt_tokens": 21, "total_tokens": 28, "completion_tokens": 7}
    assert observer.done and observer.finish_reason == "stop"


def test_usage_riding_on_a_chunk_with_choices_is_not_dropped() -> None:
    line = b'data: {"choices":[{"delta":{"content":"Hi"}}],"usage":{"completion_tokens":1}}\n\n'
    observer = StreamObserver(Ticks(), strip_usage=True)
    assert observer.feed(line) == line
    assert observer.usage == {"completion_tokens": 1}


def test_usage_events_are_dropped_with_crlf_line_ends() -> None:
    usage = b'data: {"choices":[],"usage":{"completion_tokens":2}}\r\n\r\n'
    observer = StreamObserver(Ticks(), strip_usage=True)
    assert observer.feed(b'data: {"choices":[{"text":"a"}]}\r\n\r\n' + usage
                         + b"data: [DONE]\r\n\r\n") == (
        b'data: {"choices":[{"text":"a"}]}\r\n\r\ndata: [DONE]\r\n\r\n')
    assert observer.usage == {"completion_tokens": 2}


@pytest.mark.parametrize("piece", SPLITS)
def test_each_text_event_is_counted_once_and_matches_vllms_token_count(piece: int) -> None:
    _, observer, _ = relay(fixture("vllm-chat-stream.sse"), piece)
    assert observer.usage is not None
    assert observer.text_events == observer.usage["completion_tokens"] == 7


def test_a_stream_without_usage_is_timed_over_its_text_events() -> None:
    timed = completion_of(None, dispatched_at=0.0, first_token_at=1.0, ended_at=4.0,
                          text_events=7)
    assert timed.tpot_s == pytest.approx(0.5)
    assert timed.completion_tokens is None  # output lengths are learned only from usage
    reported = completion_of({"completion_tokens": 4}, dispatched_at=0.0, first_token_at=1.0,
                             ended_at=4.0, text_events=7)
    assert reported.tpot_s == pytest.approx(1.0)
    assert completion_of(None, dispatched_at=0.0, first_token_at=1.0, ended_at=4.0,
                         text_events=1).tpot_s is None


def test_with_n_choices_usage_and_text_events_are_counted_per_choice() -> None:
    # Four choices decode side by side: 40 tokens in all is 10 each, 9 steps after the first.
    reported = completion_of({"completion_tokens": 40}, dispatched_at=0.0, first_token_at=1.0,
                             ended_at=4.0, choices=4)
    assert reported.completion_tokens == 10
    assert reported.tpot_s == pytest.approx(3.0 / 9)
    counted = completion_of(None, dispatched_at=0.0, first_token_at=1.0, ended_at=4.0,
                            text_events=40, choices=4)
    assert counted.tpot_s == pytest.approx(3.0 / 9)


@pytest.mark.parametrize("piece", SPLITS)
def test_only_whole_lines_leave_the_relay(piece: int) -> None:
    _, _, outputs = relay(fixture("vllm-chat-stream.sse"), piece)
    assert all(chunk.endswith(b"\n") for chunk in outputs if chunk)


def test_first_token_is_the_first_non_empty_content_not_the_role_chunk() -> None:
    role, hello = fixture("vllm-chat-stream.sse").split(b"\n\n")[:2]
    observer = StreamObserver(Ticks())
    observer.feed(role + b"\n\n")
    assert observer.first_token_at is None
    observer.feed(hello + b"\n\n")
    assert observer.first_token_at is not None


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        pytest.param(b'data: {"choices":[{"text":" Paris"}]}', True, id="completions text"),
        pytest.param(b'data: {"choices":[{"delta": {"content": "Hi"}}]}', True,
                     id="json with spaces after colons"),
        pytest.param(b'data: {"choices":[{"delta":{"content":""}}]}', False, id="empty content"),
        pytest.param(b'data: {"choices":[{"delta":{"content":null}}]}', False, id="null content"),
        pytest.param(b'data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}', False,
                     id="reasoning is not content"),
        pytest.param(b'data: {"choices":[{"delta":{"content":"\\"content\\":\\""}}]}', True,
                     id="escaped quotes inside text are text"),
    ],
)
def test_what_counts_as_a_first_token(line: bytes, counts: bool) -> None:
    observer = StreamObserver(Ticks())
    observer.feed(line + b"\n\n")
    assert (observer.first_token_at is not None) is counts


def test_server_side_abort_is_seen_as_finish_reason_abort_with_usage() -> None:
    _, observer, _ = relay(fixture("vllm-chat-stream-abort.sse"), 10**6)
    assert observer.finish_reason == "abort"
    assert observer.usage == {"prompt_tokens": 15, "total_tokens": 18, "completion_tokens": 3}


def test_openai_shaped_error_event_passes_unchanged_and_is_recorded() -> None:
    data = (b'data: {"error": {"message": "boom", "type": "server_error", "param": null, '
            b'"code": "engine_dead"}}\n\ndata: [DONE]\n\n')
    out, observer, _ = relay(data, 5)
    assert out == data
    assert observer.error is not None and observer.error["code"] == "engine_dead"
    assert observer.done


@pytest.mark.parametrize("piece", SPLITS)
def test_vllms_error_event_gets_openais_type_and_code(piece: int) -> None:
    """vLLM's numeric code names the status, which the 200 of a stream cannot."""
    out, observer, _ = relay(fixture("vllm-chat-stream-error.sse"), piece)
    error = orjson.loads([e for e in out.split(b"\n\n") if b'"error"' in e][0]
                         .removeprefix(b"data: "))["error"]
    assert (error["type"], error["code"]) == ("server_error", None)
    assert observer.error == error and observer.done


@pytest.mark.parametrize("piece", SPLITS)
def test_legacy_error_event_is_rewritten_into_openai_shape(piece: int) -> None:
    out, observer, _ = relay(fixture("vllm-chat-stream-error-legacy.sse"), piece)
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[0].removeprefix(b"data: "))
    assert error == {
        "error": {
            "message": "Internal server error while generating the response.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert observer.error == error["error"]


def test_a_stream_cut_before_finishing_is_incomplete() -> None:
    first_two = b"\n\n".join(fixture("vllm-chat-stream.sse").split(b"\n\n")[:2]) + b"\n\n"
    _, observer, _ = relay(first_two, 10**6)
    assert not observer.complete


def test_an_unterminated_last_line_is_released_at_the_clean_end() -> None:
    observer = StreamObserver(Ticks())
    assert observer.feed(b"data: [DONE]") == b""
    assert observer.finish() == b"data: [DONE]\n\n"
    assert observer.done


def test_error_event_is_an_sse_event_with_openai_error_body() -> None:
    event = error_event("backend b1 failed", code="upstream_stream_failed")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    body = orjson.loads(event[len(b"data: ") :])
    assert body["error"]["message"] == "backend b1 failed"
    assert body["error"]["code"] == "upstream_stream_failed"
    assert DONE_EVENT == b"data: [DONE]\n\n"
