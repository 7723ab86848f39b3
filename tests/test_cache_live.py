"""`Live`: a stream being relayed, as its followers read it. The leader only keeps references
and wakes them; a follower parses what arrived since it last looked."""

from __future__ import annotations

import orjson
import pytest

import gateway.cache.live as live_module
from gateway.cache.answer import CachedAnswer, EventWriter, split_text
from gateway.cache.live import Live

ANSWER = CachedAnswer("chat", "m", "Paris is the capital.", "stop", 9, 5)


def relayed(answer: CachedAnswer) -> list[bytes]:
    writer = EventWriter("chat", answer.model, response_id="chatcmpl-1", created=1,
                         include_usage=False)
    return [writer.start(), *(writer.piece(p) for p in split_text(answer.text)),
            *writer.end(answer)]


def test_a_follower_reads_the_text_so_far_then_what_comes_after() -> None:
    live = Live("chat")
    chunks = relayed(ANSWER)
    for chunk in chunks[:3]:
        live.feed(chunk)
    first = live.read(0)
    assert first == split_text(ANSWER.text)[:2]  # the role chunk carries no text
    for chunk in chunks[3:]:
        live.feed(chunk)
    assert "".join(first + live.read(len(first))) == ANSWER.text
    assert live.model == "m" and not live.spoiled


def test_chunks_split_mid_line_are_read_whole() -> None:
    live = Live("chat")
    data = b"".join(relayed(ANSWER))
    for i in range(0, len(data), 7):
        live.feed(data[i:i + 7])
    assert "".join(live.read(0)) == ANSWER.text


def test_a_tool_call_or_an_error_spoils_it() -> None:
    for payload in ({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [{"id": "c"}]},
                                                "finish_reason": None}]},
                    {"error": {"message": "boom"}}):
        live = Live("chat")
        live.feed(b"data: " + orjson.dumps(payload) + b"\n\n")
        live.read(0)
        assert live.spoiled


async def test_every_follower_is_woken_by_each_chunk_and_by_the_end() -> None:
    live = Live("chat")
    one, two = live.subscribe(), live.subscribe()
    live.feed(relayed(ANSWER)[0])
    assert one.is_set() and two.is_set()
    one.clear()
    two.clear()
    live.end(ANSWER)
    assert one.is_set() and two.is_set() and live.ended and live.answer == ANSWER
    live.unsubscribe(one)
    live.unsubscribe(two)
    one.clear()
    two.clear()
    live.feed(b"data: [DONE]\n\n")
    assert not one.is_set() and not two.is_set()  # unsubscribed: no longer woken


def test_a_stream_too_long_to_keep_unread_cannot_be_followed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_module, "MAX_STREAM_BYTES", 100)
    live = Live("chat")
    for chunk in relayed(ANSWER):
        live.feed(chunk)
    assert live.spoiled and live.read(0) == []


def test_a_followed_stream_keeps_its_text_not_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_module, "MAX_STREAM_BYTES", 100)
    live = Live("chat")
    waker = live.subscribe()
    for chunk in relayed(ANSWER):
        live.feed(chunk)
        live.read(0)  # the follower keeps up: what it has parsed is let go
    assert not live.spoiled
    assert "".join(live.read(0)) == ANSWER.text
    live.unsubscribe(waker)
