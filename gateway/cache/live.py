"""Identical streams in flight: a stream that misses while an identical one is being relayed
follows it, getting its text as it comes instead of asking a GPU again.

The leader's side is on the per-chunk path and stays cheap: `feed` keeps a reference to the
relayed bytes and wakes the followers, if any. A follower parses what arrived since it last
looked (`read`), in its own task, and renders its own chunks (`answer.EventWriter`). When the
leader ends, `end` hands over the whole answer (its finish reason and usage) or None: it failed,
or said something the cache cannot replay (`spoiled` tells a follower the same mid-stream).
"""

from __future__ import annotations

import asyncio

import orjson

from gateway.cache.answer import MAX_STREAM_BYTES, UNREPLAYABLE, CachedAnswer, choice_text
from gateway.cache.keys import Kind


class Live:
    __slots__ = ("_kind", "_raw", "_size", "_carry", "_pieces", "_wakers", "model", "spoiled",
                 "ended", "answer")

    def __init__(self, kind: Kind) -> None:
        self._kind: Kind = kind
        self._raw: list[bytes] = []  # relayed chunks not parsed yet, as the leader's client got
        self._size = 0  # their bytes: past MAX_STREAM_BYTES unparsed, no one may follow any more
        self._carry = b""  # an unterminated last line
        self._pieces: list[str] = []
        self._wakers: set[asyncio.Event] = set()  # one per follower
        self.model: str | None = None
        self.spoiled = False  # something a follower cannot be given arrived
        self.ended = False
        self.answer: CachedAnswer | None = None  # the whole answer, once ended well

    def feed(self, lines: bytes) -> None:
        """The leader relayed `lines` (its hot path: no parsing here)."""
        if self.spoiled:
            return
        self._raw.append(lines)
        self._size += len(lines)
        if self._size > MAX_STREAM_BYTES and not self._wakers:
            self.spoiled = True  # too long to keep for a follower who may never come
            self._raw.clear()
        self._wake()

    def end(self, answer: CachedAnswer | None) -> None:
        if not self.ended:
            self.ended = True
            self.answer = answer
            self._wake()

    def subscribe(self) -> asyncio.Event:
        """A follower's waker: set whenever there may be more to read."""
        waker = asyncio.Event()
        self._wakers.add(waker)
        return waker

    def unsubscribe(self, waker: asyncio.Event) -> None:
        self._wakers.discard(waker)

    @property
    def followers(self) -> int:
        """How many followers read this stream now."""
        return len(self._wakers)

    def read(self, start: int) -> list[str]:
        """The text pieces from the `start`th on, parsing what arrived since the last read (the
        parsed chunks are let go: the text is kept, for followers who come later)."""
        if self._raw:
            data, self._raw, self._size = b"".join(self._raw), [], 0
            self._parse(data)
        return self._pieces[start:]

    def _wake(self) -> None:
        for waker in self._wakers:
            waker.set()

    def _parse(self, data: bytes) -> None:
        data = self._carry + data
        end = data.rfind(b"\n") + 1
        self._carry = data[end:]
        for line in data[:end].split(b"\n"):
            payload = line[5:].strip() if line.startswith(b"data:") else b""
            if not payload or payload == b"[DONE]" or self.spoiled:
                continue
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError:
                event = None
            if not isinstance(event, dict) or "error" in event:
                self.spoiled = True
                return
            if self.model is None and isinstance(event.get("model"), str):
                self.model = event["model"]
            choices = event.get("choices")
            for choice in choices if isinstance(choices, list) else ():
                text = choice_text(self._kind, choice, "delta")
                if text is UNREPLAYABLE:
                    self.spoiled = True
                    return
                if isinstance(text, str) and text:
                    self._pieces.append(text)
