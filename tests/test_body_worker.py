"""A big body's way to the parse worker and back through shared memory: the parts come back
equal to what went in (long strings of any script, cut into pieces anywhere, the same string
object sent once), and no segment outlives its use."""

from __future__ import annotations

from pathlib import Path

import pytest

import gateway.body_worker as transport
from gateway.body import Parsed, parsed
from gateway.schemas import validate_chat
from tests.waiting import until

SHM = Path("/dev/shm")


def _segment_exists(name: str) -> bool:
    return (SHM / name.lstrip("/")).exists()


def _parsed(raw: bytes) -> Parsed:
    return parsed(raw, lambda data: validate_chat(data, max_messages=10_000))


FIELDS = _parsed(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}').fields


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces and long strings a few characters long, so that cuts fall inside every script."""
    monkeypatch.setattr(transport, "LONG_CHARS", 12)
    monkeypatch.setattr(transport, "PIECE_CHARS", 5)


async def test_the_parts_come_back_equal_long_strings_cut_anywhere(small_pieces: None) -> None:
    shared = "the same long string, sent once"
    parts = (
        {"messages": [{"role": "user", "content": "naïve café ☕ 東京の天気は? 🚀🚀 done"},
                      {"role": "assistant", "content": "short"}],
         "again": shared, "n": 3, "x": None},
        "role\x1fconversation text\x1e" * 3,
        shared,
    )
    reply = transport.answer(fields=FIELDS, prompt_tokens=None, parts=parts)
    assert reply.segment is not None and len(reply.strings) == 3  # content, conversation, shared
    back = await transport.parts_of(reply)
    assert back == parts
    assert back[0]["again"] is back[2]  # one string object, as in the worker


async def test_a_body_without_long_strings_needs_no_segment() -> None:
    parts = ({"model": "m"}, "user\x1fhi\x1e", "hi")
    reply = transport.answer(fields=FIELDS, prompt_tokens=None, parts=parts)
    assert reply.segment is None
    assert await transport.parts_of(reply) == ({"model": "m"}, "user\x1fhi\x1e", "hi")


async def test_the_answer_segment_is_unlinked_once_read(small_pieces: None) -> None:
    reply = transport.answer(fields=FIELDS, prompt_tokens=None, parts=("a long enough string",))
    assert reply.segment is not None and _segment_exists(reply.segment)
    await transport.parts_of(reply)
    await _until_gone(reply.segment)


async def test_the_body_segment_holds_the_bytes_and_goes_away() -> None:
    raw = bytes(range(256)) * 20_000 + b"tail"  # 5 MB: several copy slices and a short end
    segment = await transport.body_segment(raw)
    name = segment.name
    assert transport.read_segment(name, len(raw)) == raw
    transport.discard_segment(segment)
    await _until_gone(name)


async def test_a_worker_answer_whose_request_went_away_is_unlinked(small_pieces: None) -> None:
    reply = transport.answer(fields=FIELDS, prompt_tokens=None, parts=("nobody reads this one",))
    assert reply.segment is not None
    transport.discard_answer(reply)
    assert not _segment_exists(reply.segment)


async def test_parsing_through_the_segments_matches_parsing_here() -> None:
    raw = (b'{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"'
           + "règle ".encode() * 50_000 + b'"},{"role":"user","content":"q?"}]}')
    here = _parsed(raw)
    reply = transport.answer(here.fields, here.prompt_tokens,
                             (here.data, here.conversation, here.prompt_text))
    data, conversation, text = await transport.parts_of(reply)
    assert (data, conversation, text) == (here.data, here.conversation, here.prompt_text)


async def _until_gone(name: str) -> None:
    await until(lambda: not _segment_exists(name), f"segment {name} unlinked")


async def test_long_lists_come_back_batch_by_batch_equal(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(transport, "BATCH_ITEMS", 3)
    monkeypatch.setattr(transport, "LONG_CHARS", 12)
    inner = [{"type": "text", "text": f"part {i} of a message"} for i in range(7)]
    messages = [{"role": "user", "content": inner if i % 4 == 0 else f"message {i}"}
                for i in range(20)]
    parts = ({"model": "m", "messages": messages, "stop": ["a", "b", "c", "d"]},
             "user\x1fmessage text\x1e" * 5, None)
    reply = transport.answer(FIELDS, None, parts)
    assert len(reply.lists) >= 3  # messages, the shared content list, the stop list
    back = await transport.parts_of(reply)
    assert back == parts
    contents = [m["content"] for m in back[0]["messages"] if isinstance(m["content"], list)]
    assert all(c is contents[0] for c in contents)  # one list object, as in the worker
