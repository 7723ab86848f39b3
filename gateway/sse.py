"""Watching an OpenAI server-sent-event stream while relaying its bytes unchanged.

`StreamObserver.feed(chunk)` is on the per-chunk hot path. It returns the bytes to send on: the
chunk itself in the common case (no copy, no JSON parsing), cut back to its last complete line so
that every line leaves the gateway whole. Those lines are scanned with `bytes.find` for the few
facts the gateway needs: the non-empty `"content":"` / `"text":"` values (the first one is the time
to first token; their count stands in for the output tokens when no usage comes), `finish_reason`,
the `usage` object and `[DONE]`. JSON is parsed only for a line carrying a usage object or an
error; an error event in vLLM's legacy shape is rewritten into OpenAI's.

Usage on a stream comes only with `stream_options.include_usage`. The gateway asks for it on every
stream (gateway/complete.py) because it learns each backend's speed from the time per output
token; when the client did not ask, `strip_usage` drops the usage-only event (`"choices":[]`)
from what is relayed, so the client gets the stream it asked for. vLLM writes the
`system_fingerprint` on the stream's last event only, which with usage asked for is that usage
event: the event carrying the last finish_reason is then held back until the next one arrives
(at once, in practice) and given the dropped event's fingerprint, as the client would have had it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.errors import error_object, normalise_error

DONE_EVENT = b"data: [DONE]\n\n"

# Keys whose non-empty string value is generated text. A match needs the opening quote, so
# `"reasoning_content":` does not match `"content":`; quotes inside text are escaped (\").
_TEXT_KEYS = (b'"content":"', b'"text":"', b'"content": "', b'"text": "')
_FINISH_KEYS = (b'"finish_reason":"', b'"finish_reason": "')
_USAGE_KEYS = (b'"usage":{', b'"usage": {')
_FINGERPRINT_KEY = b'"system_fingerprint"'
_DONE = b"data: [DONE]"
_ERROR_KEY = b'"error"'
_QUOTE = 0x22


def error_event(
    message: str, *, type_: str = "upstream_error", code: str | None = None
) -> bytes:
    """An SSE event carrying OpenAI's error object, as vLLM sends a mid-stream failure."""
    return b"data: " + orjson.dumps(error_object(message, type_=type_, code=code)) + b"\n\n"


class StreamObserver:
    """Relays one SSE stream and remembers what the gateway must know about it."""

    __slots__ = ("_carry", "_clock", "_on_first_token", "_strip_usage", "_blank_owed",
                 "_on_tokens", "_next_tokens", "_held", "_hold_once", "_dropped_fingerprint",
                 "first_token_at", "text_events", "finish_reason", "usage", "error", "done")

    def __init__(self, clock: Callable[[], float],
                 on_first_token: Callable[[float], None] | None = None, *,
                 strip_usage: bool = False,
                 on_tokens: Callable[[int], int | None] | None = None) -> None:
        self._carry = b""
        self._clock = clock
        self._on_first_token = on_first_token  # called once, with first_token_at
        self._strip_usage = strip_usage  # drop usage-only events (the client did not ask)
        self._blank_owed = False  # a dropped event's closing blank line is still to come
        # Called with text_events once they reach _next_tokens; returns the next such count
        # (None: never again). The reservation's re-estimate as a reply streams.
        self._on_tokens = on_tokens
        self._next_tokens: int | None = 1 if on_tokens is not None else None
        self._held = b""  # the finish event, held until the usage event that may follow it
        self._hold_once = strip_usage  # whether the finish event may still be held
        self._dropped_fingerprint: str | None = None  # of the usage event dropped just now
        self.first_token_at: float | None = None  # clock() when the first text token arrived
        self.text_events = 0  # events carrying generated text: one token each on vLLM's defaults
        self.finish_reason: str | None = None  # the last non-null finish_reason seen
        self.usage: dict[str, Any] | None = None  # the usage object, if the stream carried one
        self.error: dict[str, Any] | None = None  # the backend's error event, normalised
        self.done = False  # `data: [DONE]` seen

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send on for this chunk (possibly empty while a line is incomplete)."""
        if self._carry:
            chunk = self._carry + chunk
            self._carry = b""
        end = chunk.rfind(b"\n") + 1
        if end == 0:
            self._carry = chunk
            return b""
        if end != len(chunk):
            self._carry = chunk[end:]
            chunk = chunk[:end]
        if self._blank_owed:
            self._blank_owed = False
            if chunk.startswith(b"\n") or chunk.startswith(b"\r\n"):
                chunk = chunk[chunk.find(b"\n") + 1:]
                if not chunk:
                    return b""
        texts = _count_text(chunk)
        if texts:
            self.text_events += texts
            if self.first_token_at is None:
                self.first_token_at = self._clock()
                if self._on_first_token is not None:
                    self._on_first_token(self.first_token_at)
            if self._next_tokens is not None and self.text_events >= self._next_tokens:
                assert self._on_tokens is not None
                self._next_tokens = self._on_tokens(self.text_events)
        for key in _FINISH_KEYS:
            if key in chunk:
                self._read_finish_reason(chunk, key)
        for key in _USAGE_KEYS:
            if key in chunk:
                chunk = self._take_usage(chunk, key)
        if _ERROR_KEY in chunk:
            chunk = self._rewrite_errors(chunk)
        if _DONE in chunk:
            self.done = True
        if self._strip_usage:
            chunk = self._fingerprinted(chunk)
        return chunk

    def finish(self) -> bytes:
        """At a clean end of the upstream body: the rest of an unterminated last line, if any,
        and a held finish event."""
        if self._carry:
            return self.feed(b"\n\n")
        held, self._held = self._held, b""
        return held

    def _fingerprinted(self, chunk: bytes) -> bytes:
        """`chunk` after a held finish event, that event given the fingerprint of a usage event
        dropped from `chunk`; or, while no usage came, `chunk` up to its last finish event, which
        is held."""
        fingerprint, self._dropped_fingerprint = self._dropped_fingerprint, None
        if self._held:
            if fingerprint is None and b"data:" not in chunk:
                self._held += chunk  # the held event's closing blank line: no event yet
                return b""
            chunk = self._held + chunk
            self._held = b""
        if fingerprint is not None:
            return _with_fingerprint(chunk, fingerprint)
        if self._hold_once and self.usage is None and not self.done:
            at = max(chunk.rfind(key) for key in _FINISH_KEYS)
            if at >= 0:
                self._hold_once = False
                start = chunk.rfind(b"\n", 0, at) + 1
                self._held = chunk[start:]
                return chunk[:start]
        return chunk

    @property
    def complete(self) -> bool:
        """The stream ended as a stream should: `[DONE]`, or at least a finish_reason."""
        return self.done or self.finish_reason is not None

    def _read_finish_reason(self, chunk: bytes, key: bytes) -> None:
        start = chunk.find(key)
        while start >= 0:
            value_start = start + len(key)
            value_end = chunk.find(b'"', value_start)
            if value_end < 0:
                return
            self.finish_reason = chunk[value_start:value_end].decode("utf-8", "replace")
            start = chunk.find(key, value_end)

    def _take_usage(self, chunk: bytes, key: bytes) -> bytes:
        """Remember the usage object of every line carrying `key`; with `strip_usage`, the
        chunk without its usage-only events (each line and the blank line ending its event)."""
        at = chunk.find(key)
        while at >= 0:
            start = chunk.rfind(b"\n", 0, at) + 1
            end = chunk.find(b"\n", at)
            end = len(chunk) if end < 0 else end + 1
            payload = _data_json(chunk[start:end])
            if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
                self.usage = payload["usage"]
                if self._strip_usage and not payload.get("choices"):
                    fingerprint = payload.get("system_fingerprint")
                    if isinstance(fingerprint, str):
                        self._dropped_fingerprint = fingerprint
                    if chunk.startswith(b"\r\n", end):
                        end += 2
                    elif chunk.startswith(b"\n", end):
                        end += 1
                    else:
                        self._blank_owed = end == len(chunk)
                    chunk = chunk[:start] + chunk[end:]
                    end = start
            at = chunk.find(key, end)
        return chunk

    def _rewrite_errors(self, chunk: bytes) -> bytes:
        lines = chunk.split(b"\n")
        changed = False
        for i, line in enumerate(lines):
            if _ERROR_KEY not in line or not line.startswith(b"data:"):
                continue
            try:
                payload = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                continue
            normalised = normalise_error(payload, status=500)
            if normalised is None:
                continue
            self.error = normalised["error"]
            if normalised != payload:
                lines[i] = b"data: " + orjson.dumps(normalised)
                changed = True
        return b"\n".join(lines) if changed else chunk


def _with_fingerprint(chunk: bytes, fingerprint: str) -> bytes:
    """`chunk` with `"system_fingerprint"` added to its last finish event's JSON object, unless
    that event has one already."""
    at = max(chunk.rfind(key) for key in _FINISH_KEYS)
    if at < 0:
        return chunk
    start = chunk.rfind(b"\n", 0, at) + 1
    end = chunk.find(b"\n", at)
    end = len(chunk) if end < 0 else end
    line = chunk[start:end]
    close = line.rfind(b"}")
    if not line.startswith(b"data:") or close < 0 or _FINGERPRINT_KEY in line:
        return chunk
    field = b',"system_fingerprint":' + orjson.dumps(fingerprint)
    return chunk[:start + close] + field + chunk[start + close:]


def _count_text(chunk: bytes) -> int:
    """How many non-empty generated-text values the chunk carries."""
    count = 0
    for key in _TEXT_KEYS:
        at = chunk.find(key)
        while at >= 0:
            value = at + len(key)
            if value < len(chunk) and chunk[value] != _QUOTE:
                count += 1
            at = chunk.find(key, value)
    return count


def _data_json(line: bytes) -> object:
    """The JSON payload of one `data:` line, or None."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    try:
        return orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return None


def finish_reason_of(answer: Mapping[str, Any] | None) -> str | None:
    """A whole (non-streamed) answer's first choice's finish_reason, if it has one."""
    choices = answer.get("choices") if answer else None
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, Mapping) else None
    return reason if isinstance(reason, str) else None
