"""Watching an OpenAI server-sent-event stream while relaying its bytes unchanged.

`StreamObserver.feed(chunk)` is on the per-chunk hot path. It returns the bytes to send on: the
chunk itself in the common case (no copy, no JSON parsing), cut back to its last complete line so
that every line leaves the gateway whole. Those lines are scanned with `bytes.find` for the few
facts the gateway needs: the first non-empty `"content":"` / `"text":"` value (time to first token),
`finish_reason`, the `usage` object and `[DONE]`. JSON is parsed only for a line carrying a usage
object or an error; an error event in vLLM's legacy shape is rewritten into OpenAI's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.errors import error_object, normalise_error

DONE_EVENT = b"data: [DONE]\n\n"

# Keys whose non-empty string value is generated text. A match needs the opening quote, so
# `"reasoning_content":` does not match `"content":`; quotes inside text are escaped (\").
_TEXT_KEYS = (b'"content":"', b'"text":"', b'"content": "', b'"text": "')
_FINISH_KEYS = (b'"finish_reason":"', b'"finish_reason": "')
_USAGE_KEYS = (b'"usage":{', b'"usage": {')
_DONE = b"data: [DONE]"
_ERROR_KEY = b'"error"'
_QUOTE = 0x22


def error_event(
    message: str, *, type_: str = "upstream_error", code: str | int | None = None
) -> bytes:
    """An SSE event carrying OpenAI's error object, as vLLM sends a mid-stream failure."""
    return b"data: " + orjson.dumps(error_object(message, type_=type_, code=code)) + b"\n\n"


class StreamObserver:
    """Relays one SSE stream and remembers what the gateway must know about it."""

    __slots__ = ("_carry", "_clock", "_on_first_token", "first_token_at", "finish_reason",
                 "usage", "error", "done")

    def __init__(self, clock: Callable[[], float],
                 on_first_token: Callable[[float], None] | None = None) -> None:
        self._carry = b""
        self._clock = clock
        self._on_first_token = on_first_token  # called once, with first_token_at
        self.first_token_at: float | None = None  # clock() when the first text token arrived
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
        if self.first_token_at is None and _has_text(chunk):
            self.first_token_at = self._clock()
            if self._on_first_token is not None:
                self._on_first_token(self.first_token_at)
        for key in _FINISH_KEYS:
            if key in chunk:
                self._read_finish_reason(chunk, key)
        for key in _USAGE_KEYS:
            if key in chunk:
                self._read_usage(chunk, chunk.find(key))
        if _ERROR_KEY in chunk:
            chunk = self._rewrite_errors(chunk)
        if _DONE in chunk:
            self.done = True
        return chunk

    def finish(self) -> bytes:
        """At a clean end of the upstream body: the rest of an unterminated last line, if any."""
        if not self._carry:
            return b""
        return self.feed(b"\n\n")

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

    def _read_usage(self, chunk: bytes, at: int) -> None:
        payload = _line_json(chunk, at)
        if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]

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


def _has_text(chunk: bytes) -> bool:
    for key in _TEXT_KEYS:
        at = chunk.find(key)
        while at >= 0:
            value = at + len(key)
            if value < len(chunk) and chunk[value] != _QUOTE:
                return True
            at = chunk.find(key, value)
    return False


def _line_json(chunk: bytes, at: int) -> object:
    """The JSON payload of the `data:` line containing offset `at`, or None."""
    start = chunk.rfind(b"\n", 0, at) + 1
    end = chunk.find(b"\n", at)
    line = chunk[start : end if end >= 0 else len(chunk)].strip()
    if not line.startswith(b"data:"):
        return None
    try:
        return orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return None
