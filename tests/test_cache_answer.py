"""Cached answers: only a single plain-text choice that ended in stop/length is kept, from a JSON
body or a relayed stream, and it is served back as OpenAI's JSON body or event stream, which the
gateway's own stream observer and the collector read back to the same answer."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cache.answer import (
    CachedAnswer,
    Kind,
    StreamCollector,
    answer_from_payload,
    render_events,
    render_json,
    split_text,
)
from gateway.sse import StreamObserver
from tests.paths import FIXTURES

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

ANSWERS = [
    pytest.param(CachedAnswer("chat", MODEL, "Paris is the capital of France.", "stop", 21, 7),
                 id="chat with usage"),
    pytest.param(CachedAnswer("text", MODEL, "  once upon\na time,\tthere", "length", 5, 16),
                 id="text cut at length with odd whitespace"),
    pytest.param(CachedAnswer("chat", MODEL, "Ünïcödé 🙂 \"quoted\" \\ back\nslash", "stop",
                              None, None), id="chat with escapes and unknown usage"),
    pytest.param(CachedAnswer("text", MODEL, "", "stop", 3, 0), id="empty text"),
    pytest.param(CachedAnswer("chat", MODEL, "   ", "stop", 3, 1), id="whitespace-only text"),
]


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def chat_body(message: dict[str, Any] | None = None, **choice: Any) -> dict[str, Any]:
    """A vLLM chat completion body (with vLLM's empty/null extra message fields)."""
    msg = {"role": "assistant", "content": "Hi there.", "refusal": None, "tool_calls": [],
           "function_call": None, "reasoning_content": None, **(message or {})}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": "stop",
                         "stop_reason": None, **choice}],
            "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3}}


def text_body(**choice: Any) -> dict[str, Any]:
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "text": " world", "logprobs": None,
                         "finish_reason": "length", **choice}],
            "usage": {"prompt_tokens": 2, "total_tokens": 18, "completion_tokens": 16}}


def decoded(body: bytes) -> object:
    """A body as the proxy hands it on: decoded, or None when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def events_of(stream: bytes) -> list[dict[str, Any]]:
    payloads = [line[6:] for line in stream.split(b"\n") if line.startswith(b"data: ")]
    return [orjson.loads(p) for p in payloads if p != b"[DONE]"]


def pieces_of(kind: Kind, chunks: list[dict[str, Any]]) -> list[str]:
    """The non-empty generated text of each chunk."""
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    texts = [c["delta"].get("content", "") if kind == "chat" else c["text"] for c in choices]
    return [t for t in texts if t]


def streamed(answer: CachedAnswer) -> CachedAnswer:
    """`answer` as collected from a stream of its word pieces: the pieces' lengths kept."""
    cuts = tuple(len(piece) for piece in split_text(answer.text))
    return dataclasses.replace(answer, cuts=cuts or None)


def collect(kind: Kind, *feeds: bytes) -> CachedAnswer | None:
    collector = StreamCollector(kind)
    for lines in feeds:
        collector.feed(lines)
    return collector.answer()


# --- storage form ------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", ANSWERS)
def test_an_answer_survives_its_byte_form(answer: CachedAnswer) -> None:
    assert CachedAnswer.from_bytes(answer.to_bytes()) == answer


GOOD = orjson.loads(CachedAnswer("chat", MODEL, "x", "stop", 1, 1).to_bytes())


@pytest.mark.parametrize("raw", [
    pytest.param(b"\x00garbage", id="not JSON"),
    pytest.param(b"[]", id="not an object"),
    pytest.param(orjson.dumps({**GOOD, "kind": "embedding"}), id="unknown kind"),
    pytest.param(orjson.dumps({k: v for k, v in GOOD.items() if k != "model"}), id="no model"),
    pytest.param(orjson.dumps({**GOOD, "text": None}), id="null text"),
    pytest.param(orjson.dumps({**GOOD, "finish_reason": "tool_calls"}), id="uncacheable finish"),
    pytest.param(orjson.dumps({**GOOD, "prompt_tokens": "9"}), id="string token count"),
    pytest.param(orjson.dumps({**GOOD, "completion_tokens": True}), id="bool token count"),
    pytest.param(orjson.dumps({**GOOD, "completion_tokens": -1}), id="negative token count"),
])
def test_bytes_that_are_not_a_cached_answer_raise_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        CachedAnswer.from_bytes(raw)


# --- JSON bodies -------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "body", "expected"), [
    pytest.param("chat", chat_body(), CachedAnswer("chat", MODEL, "Hi there.", "stop", 9, 3),
                 id="vLLM chat body with empty tool_calls and null extras"),
    pytest.param("chat", {k: v for k, v in chat_body(finish_reason="length").items()
                          if k != "usage"},
                 CachedAnswer("chat", MODEL, "Hi there.", "length", None, None),
                 id="chat cut at length without usage"),
    pytest.param("chat", chat_body({"content": ""}),
                 CachedAnswer("chat", MODEL, "", "stop", 9, 3), id="empty content is text"),
    pytest.param("text", text_body(), CachedAnswer("text", MODEL, " world", "length", 2, 16),
                 id="completions body"),
])
def test_a_single_text_choice_ending_in_stop_or_length_is_kept(
        kind: Kind, body: dict[str, Any], expected: CachedAnswer) -> None:
    assert answer_from_payload(kind, body) == expected


TOOL_CALL = [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{}"}}]


@pytest.mark.parametrize(("kind", "body"), [
    pytest.param("chat", orjson.dumps(chat_body({"content": None, "tool_calls": TOOL_CALL},
                                                finish_reason="tool_calls")),
                 id="tool call answer"),
    pytest.param("chat", orjson.dumps(chat_body({"tool_calls": TOOL_CALL})),
                 id="tool_calls beside text even with finish stop"),
    pytest.param("chat", orjson.dumps(chat_body(finish_reason="tool_calls")),
                 id="finish_reason tool_calls"),
    pytest.param("chat", orjson.dumps(chat_body(
        {"function_call": {"name": "f", "arguments": "{}"}})), id="legacy function_call"),
    pytest.param("chat", orjson.dumps(chat_body({"content": None, "refusal": "I can't."})),
                 id="refusal with null content"),
    pytest.param("chat", orjson.dumps(chat_body({"content": None})), id="null content"),
    pytest.param("chat", orjson.dumps(chat_body({"reasoning_content": "Let me think."})),
                 id="reasoning text the cache cannot replay"),
    pytest.param("chat", orjson.dumps({**chat_body(), "choices": chat_body()["choices"] * 2}),
                 id="two choices"),
    pytest.param("chat", orjson.dumps({**chat_body(), "choices": []}), id="no choices"),
    pytest.param("chat", orjson.dumps(chat_body(finish_reason=None)), id="no finish_reason"),
    pytest.param("chat", orjson.dumps(chat_body(finish_reason="abort")), id="vLLM abort"),
    pytest.param("chat", orjson.dumps(chat_body(finish_reason="content_filter")),
                 id="content filter"),
    pytest.param("chat", orjson.dumps({k: v for k, v in chat_body().items() if k != "model"}),
                 id="no model"),
    pytest.param("chat", fixture("vllm-error.json"), id="OpenAI error body"),
    pytest.param("chat", fixture("vllm-error-legacy.json"), id="legacy vLLM error body"),
    pytest.param("chat", b'{"choices": [', id="bad JSON"),
    pytest.param("chat", b'"just a string"', id="JSON that is not an object"),
    pytest.param("chat", orjson.dumps(text_body()), id="completions body read as chat"),
    pytest.param("text", orjson.dumps(chat_body()), id="chat body read as completions"),
    pytest.param("text", orjson.dumps(text_body(text=None)), id="null text"),
])
def test_bodies_the_cache_cannot_replay_are_not_kept(kind: Kind, body: bytes) -> None:
    assert answer_from_payload(kind, decoded(body)) is None


def test_render_json_is_openais_chat_completion_body() -> None:
    answer = CachedAnswer("chat", MODEL, "Hi.", "stop", 9, 3)
    assert orjson.loads(render_json(answer, response_id="chatcmpl-x", created=17)) == {
        "id": "chatcmpl-x", "object": "chat.completion", "created": 17, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi."},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}


def test_render_json_is_openais_text_completion_body_without_unknown_usage() -> None:
    answer = CachedAnswer("text", MODEL, " world", "length", None, None)
    assert orjson.loads(render_json(answer, response_id="cmpl-x", created=17)) == {
        "id": "cmpl-x", "object": "text_completion", "created": 17, "model": MODEL,
        "choices": [{"index": 0, "text": " world", "logprobs": None, "finish_reason": "length"}]}


def test_a_replay_names_the_weights_that_wrote_the_answer() -> None:
    answer = CachedAnswer("chat", MODEL, "Hi there.", "stop", 9, 3, fingerprint="fp_v2")
    assert orjson.loads(render_json(answer, response_id="r", created=1))[
        "system_fingerprint"] == "fp_v2"
    events = render_events(answer, response_id="r", created=1, include_usage=True)
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert {chunk["system_fingerprint"] for chunk in chunks} == {"fp_v2"}


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_rendered_body_reads_back_as_the_same_answer(answer: CachedAnswer) -> None:
    rendered = render_json(answer, response_id="r", created=1)
    assert answer_from_payload(answer.kind, orjson.loads(rendered)) == answer


# --- event streams -----------------------------------------------------------------------------

USAGE = [pytest.param(True, id="include_usage"), pytest.param(False, id="no usage asked")]


@pytest.mark.parametrize("include_usage", USAGE)
@pytest.mark.parametrize("answer", ANSWERS)
def test_rendered_events_are_whole_sse_events_ending_with_done(
        answer: CachedAnswer, include_usage: bool) -> None:
    events = render_events(answer, response_id="r", created=5, include_usage=include_usage)
    assert events[-1] == b"data: [DONE]\n\n"
    for event in events:
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        assert event.count(b"\n") == 2  # one data line, one event
    chunks = events_of(b"".join(events))
    assert len(chunks) == len(events) - 1
    obj = "chat.completion.chunk" if answer.kind == "chat" else "text_completion"
    assert {(c["id"], c["object"], c["created"], c["model"]) for c in chunks} == {
        ("r", obj, 5, MODEL)}
    with_choices = [c for c in chunks if c["choices"]]
    assert [c["choices"][0]["finish_reason"] for c in with_choices] == (
        [None] * (len(with_choices) - 1) + [answer.finish_reason])
    if answer.kind == "chat":
        assert with_choices[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert with_choices[-1]["choices"][0]["delta"] == {}
        pieces = [c["choices"][0]["delta"]["content"] for c in with_choices[1:-1]]
    else:
        assert with_choices[-1]["choices"][0]["text"] == ""
        pieces = [c["choices"][0]["text"] for c in with_choices[:-1]]
    assert "".join(pieces) == answer.text
    assert all(pieces), "no empty piece chunks (empty text gives none)"
    if include_usage:
        assert all(c["usage"] is None for c in with_choices)
    else:
        assert all("usage" not in c for c in chunks)
    usage_chunks = [c for c in chunks if not c["choices"]]
    if include_usage and answer.prompt_tokens is not None:
        assert usage_chunks == [chunks[-1]]
        assert chunks[-1]["usage"] == orjson.loads(
            render_json(answer, response_id="r", created=5))["usage"]
    else:
        assert usage_chunks == []


@pytest.mark.parametrize(("text", "pieces"), [
    pytest.param("Hello, world!  How are you?", ["Hello, ", "world!  ", "How ", "are ", "you?"],
                 id="a word with the whitespace after it"),
    pytest.param("\n\nTitle\n", ["\n\nTitle\n"], id="leading whitespace rides on the first word"),
    pytest.param("", [], id="empty text has no pieces"),
])
def test_text_is_streamed_about_a_word_per_chunk(text: str, pieces: list[str]) -> None:
    events = render_events(CachedAnswer("text", MODEL, text, "stop", None, None),
                           response_id="r", created=1, include_usage=False)
    assert [c["choices"][0]["text"] for c in events_of(b"".join(events))][:-1] == pieces


@pytest.mark.parametrize("include_usage", USAGE)
@pytest.mark.parametrize("answer", ANSWERS)
def test_the_gateways_stream_observer_reads_a_rendered_stream_as_complete(
        answer: CachedAnswer, include_usage: bool) -> None:
    stream = b"".join(render_events(answer, response_id="r", created=1,
                                    include_usage=include_usage))
    observer = StreamObserver(lambda: 0.0)
    assert observer.feed(stream) + observer.finish() == stream
    assert observer.complete and observer.done and observer.error is None
    assert observer.finish_reason == answer.finish_reason
    assert observer.text_events == len(pieces_of(answer.kind, events_of(stream)))
    if include_usage and answer.prompt_tokens is not None:
        assert observer.usage == orjson.loads(render_json(answer, response_id="r", created=1))[
            "usage"]
    else:
        assert observer.usage is None


@pytest.mark.parametrize("include_usage", USAGE)
@pytest.mark.parametrize("answer", ANSWERS)
def test_collecting_a_rendered_stream_gives_back_the_answer(
        answer: CachedAnswer, include_usage: bool) -> None:
    events = render_events(answer, response_id="r", created=1, include_usage=include_usage)
    expected = streamed(answer) if include_usage else dataclasses.replace(
        streamed(answer), prompt_tokens=None, completion_tokens=None)
    assert collect(answer.kind, b"".join(events)) == expected
    assert collect(answer.kind, *events) == expected


@settings(max_examples=200, deadline=None)
@given(answer=st.sampled_from([p.values[0] for p in ANSWERS]), data=st.data())
def test_collecting_gives_the_same_answer_however_the_lines_are_grouped(
        answer: CachedAnswer, data: st.DataObject) -> None:
    stream = b"".join(render_events(answer, response_id="r", created=1, include_usage=True))
    lines = stream.splitlines(keepends=True)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(lines) - 1))))
    feeds = [b"".join(lines[a:b]) for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]
    assert collect(answer.kind, *feeds) == streamed(answer)


@pytest.mark.parametrize("grouping", [pytest.param("whole", id="fed whole"),
                                      pytest.param("lines", id="fed a line at a time"),
                                      pytest.param("crlf", id="with CRLF line ends")])
def test_the_real_vllm_stream_is_collected(grouping: str) -> None:
    stream = fixture("vllm-chat-stream.sse")
    if grouping == "crlf":
        stream = stream.replace(b"\n", b"\r\n")
    feeds = stream.splitlines(keepends=True) if grouping == "lines" else [stream]
    assert collect("chat", *feeds) == CachedAnswer(
        "chat", MODEL, "Hello! How can I help?", "stop", 21, 7, cuts=(5, 1, 4, 4, 2, 5, 1))


def chunk(choice: dict[str, Any], **extra: Any) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                                     "choices": [choice], **extra}) + b"\n\n"


def delta(content: dict[str, Any], finish_reason: str | None = None, index: int = 0) -> bytes:
    return chunk({"index": index, "delta": content, "logprobs": None,
                  "finish_reason": finish_reason})


REAL = fixture("vllm-chat-stream.sse")
BEFORE_FINISH = REAL[:REAL.index(b'"finish_reason":"stop"')]
BEFORE_FINISH = BEFORE_FINISH[:BEFORE_FINISH.rindex(b"\n") + 1]
TOOL_DELTA = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": ""}}]}


@pytest.mark.parametrize("stream", [
    pytest.param(fixture("vllm-chat-stream-error.sse"), id="mid-stream error event"),
    pytest.param(fixture("vllm-chat-stream-error-legacy.sse"), id="legacy error event"),
    pytest.param(fixture("vllm-chat-stream-abort.sse"), id="vLLM abort finish_reason"),
    pytest.param(BEFORE_FINISH, id="stream cut before its finish_reason"),
    pytest.param(BEFORE_FINISH + b"data: [DONE]\n\n", id="DONE without a finish_reason"),
    pytest.param(delta({"role": "assistant", "content": None}) + delta(TOOL_DELTA)
                 + delta({}, "tool_calls") + b"data: [DONE]\n\n", id="tool call deltas"),
    pytest.param(delta({"content": "It is "}) + delta(TOOL_DELTA) + delta({}, "stop"),
                 id="tool call delta beside text ending in stop"),
    pytest.param(delta({"reasoning_content": "hmm"}) + delta({"content": "Yes"}, "stop"),
                 id="reasoning deltas"),
    pytest.param(delta({"content": "a"}, "stop") + delta({"content": "b"}, "stop", index=1),
                 id="a second choice"),
    pytest.param(delta({"content": "a"}) + b"data: {not json\n\n" + delta({}, "stop"),
                 id="a data line that is not JSON"),
    pytest.param(delta({"content": "a"}, "stop") + b"data: " + orjson.dumps(
        {"error": {"message": "boom", "type": "server_error", "param": None, "code": 500}})
        + b"\n\n", id="error after the finish_reason"),
    pytest.param(b"", id="nothing at all"),
])
def test_streams_the_cache_cannot_replay_give_no_answer(stream: bytes) -> None:
    assert collect("chat", stream) is None


def test_comment_and_blank_lines_are_ignored_and_empty_tool_calls_are_not_tool_calls() -> None:
    stream = (b": keep-alive\n\n" + delta({"role": "assistant", "content": "", "tool_calls": []})
              + delta({"content": "Yes."}) + delta({}, "stop")
              + chunk({"index": 0, "delta": {}}, usage=None)
              + b"data: " + orjson.dumps({"choices": [], "model": MODEL,
                                          "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
              + b"\n\ndata: [DONE]\n\n")
    assert collect("chat", stream) == CachedAnswer("chat", MODEL, "Yes.", "stop", 4, 2, cuts=(4,))


def test_a_completions_stream_is_collected_from_its_text_fields() -> None:
    def text_chunk(text: str, finish_reason: str | None) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return b"data: " + orjson.dumps(
            {"object": "text_completion", "model": MODEL, "choices": [choice]}) + b"\n\n"

    stream = text_chunk(" a", None) + text_chunk(" b", "length") + b"data: [DONE]\n\n"
    assert collect("text", stream) == CachedAnswer("text", MODEL, " a b", "length", None, None,
                                                   cuts=(2, 2))
    assert collect("chat", stream) is None


def test_a_replayed_stream_keeps_the_chunk_boundaries_the_backend_streamed() -> None:
    stream = (delta({"role": "assistant", "content": ""}) + delta({"content": "Hel"})
              + delta({"content": "lo, w"}) + delta({"content": "orld"}) + delta({}, "stop")
              + b"data: [DONE]\n\n")
    answer = collect("chat", stream)
    assert answer is not None and answer.pieces() == ["Hel", "lo, w", "orld"]
    replayed = render_events(CachedAnswer.from_bytes(answer.to_bytes()), response_id="r",
                             created=1, include_usage=False)
    texts = [c["choices"][0]["delta"].get("content") for c in events_of(b"".join(replayed))]
    assert texts == ["", "Hel", "lo, w", "orld", None]


@pytest.mark.parametrize("cuts", [
    pytest.param([2, 2], id="cuts that do not add up to the text"),
    pytest.param([0, 5], id="an empty cut"),
    pytest.param(["5"], id="a cut that is not a number"),
    pytest.param(True, id="not a list"),
])
def test_stored_cuts_that_do_not_tile_the_text_replay_split_by_words(cuts: object) -> None:
    raw = orjson.loads(CachedAnswer("chat", MODEL, "Hi you", "stop", 1, 2).to_bytes())
    answer = CachedAnswer.from_bytes(orjson.dumps({**raw, "cuts": cuts}))
    assert answer.cuts is None and answer.pieces() == ["Hi ", "you"]
