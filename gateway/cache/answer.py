"""A cached answer: what the cache keeps of one completion, and how it is served again.

The cache keeps only what it can replay faithfully: one choice of plain text that ended with
`stop` or `length`, the model that wrote it and its token counts. Anything richer (tool calls,
refusals, reasoning text, several choices, errors, streams cut short) is not cached at all, so a
hit never serves an answer that lost something the backend said.

Answers come from a backend's decoded JSON body (`answer_from_payload`) or from a relayed SSE
stream (`StreamCollector`, which keeps the relayed bytes and parses them once at the end), with
the backend's `system_fingerprint` when it sent one (the weights that wrote it), and are
served back as an OpenAI JSON body (`render_json`) or as an OpenAI event stream
(`render_events`). Everything here is pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.cache.keys import Kind

_FINISH_REASONS = ("stop", "length")
_KINDS = ("chat", "text")
# Message fields the cache cannot replay: a message carrying any of them (non-empty) is not kept.
_UNCACHEABLE = ("tool_calls", "function_call", "refusal", "reasoning_content", "reasoning")
_PLAIN = frozenset({"role", "content"})  # a message or delta with only these is plain text
MAX_STREAM_BYTES = 4 << 20  # a relayed stream longer than this is not collected
# A word with the whitespace after it (leading whitespace rides on the first word); whitespace-only
# text is one piece. The matches tile the text, so "".join(pieces) == text.
_PIECE = re.compile(r"\s*\S+\s*|\s+")
_DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    kind: Kind
    model: str  # the model that produced it (the response's "model")
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int | None
    completion_tokens: int | None
    fingerprint: str | None = None  # the backend's system_fingerprint, when it sent one
    # The lengths (in characters) of the text pieces a stream carried, in order, so a replay
    # keeps the backend's own chunk boundaries; None for an answer that came whole.
    cuts: tuple[int, ...] | None = None

    def to_bytes(self) -> bytes:
        return orjson.dumps({
            "kind": self.kind, "model": self.model, "text": self.text,
            "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "fingerprint": self.fingerprint,
            "cuts": self.cuts,
        })

    def pieces(self) -> list[str]:
        """The text in the pieces a replay sends: the stream's own when known, else a word
        with the whitespace after it each; "".join(pieces) == text."""
        cuts, text = self.cuts, self.text
        if cuts is None:
            return split_text(text)
        out, at = [], 0
        for cut in cuts:
            out.append(text[at:at + cut])
            at += cut
        return out

    @classmethod
    def from_bytes(cls, raw: bytes) -> CachedAnswer:
        """The answer `to_bytes` wrote; ValueError when `raw` is not one."""
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"cached answer is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError("cached answer is not a JSON object")
        kind, model, text = data.get("kind"), data.get("model"), data.get("text")
        finish_reason = data.get("finish_reason")
        if kind not in _KINDS or not isinstance(model, str) or not isinstance(text, str):
            raise ValueError("cached answer lacks a valid kind, model or text")
        if finish_reason not in _FINISH_REASONS:
            raise ValueError(f"cached answer has finish_reason {finish_reason!r}")
        counts = [data.get("prompt_tokens"), data.get("completion_tokens")]
        if any(c is not None and _token_count(c) is None for c in counts):
            raise ValueError("cached answer has a malformed token count")
        fingerprint = data.get("fingerprint")
        return cls(kind=kind, model=model, text=text, finish_reason=finish_reason,
                   prompt_tokens=counts[0], completion_tokens=counts[1],
                   fingerprint=fingerprint if isinstance(fingerprint, str) else None,
                   cuts=_cuts_of(data.get("cuts"), text))


def _cuts_of(value: object, text: str) -> tuple[int, ...] | None:
    """Stored cuts that tile `text` exactly, else None (an entry written without them, or one
    that does not fit its text, replays split by words)."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in value):
        return None
    return tuple(value) if sum(value) == len(text) else None


def answer_from_payload(kind: Kind, data: object) -> CachedAnswer | None:
    """The answer in a backend's 200 JSON body (decoded), or None when it is not one the cache
    may keep: exactly one choice of text (no tool calls, refusal or reasoning) ending in stop or
    length."""
    if not isinstance(data, dict) or "error" in data:
        return None
    model, choices = data.get("model"), data.get("choices")
    if not isinstance(model, str) or not isinstance(choices, list) or len(choices) != 1:
        return None
    choice = choices[0]
    finish_reason = choice.get("finish_reason") if isinstance(choice, dict) else None
    if finish_reason not in _FINISH_REASONS:
        return None
    text = choice_text(kind, choice, "message")
    if not isinstance(text, str):
        return None
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return CachedAnswer(kind=kind, model=model, text=text, finish_reason=finish_reason,
                        prompt_tokens=_token_count(usage.get("prompt_tokens")),
                        completion_tokens=_token_count(usage.get("completion_tokens")),
                        fingerprint=_fingerprint(data))


def _fingerprint(event: dict[str, Any]) -> str | None:
    value = event.get("system_fingerprint")
    return value if isinstance(value, str) and value else None


class StreamCollector:
    """Collects the answer of one relayed SSE stream, fed the same complete lines the client gets.

    `feed` runs once per relayed chunk, on the hot path: it only keeps the bytes. `answer` parses
    them once, at the end, as one JSON array of the `data:` payloads (one C-level parse instead
    of one per event). A stream longer than `MAX_STREAM_BYTES` is not kept: its memory is not
    worth an answer that long."""

    __slots__ = ("_kind", "_chunks", "_size")

    def __init__(self, kind: Kind) -> None:
        self._kind: Kind = kind
        self._chunks: list[bytes] | None = []  # None: too long, nothing to answer
        self._size = 0

    def feed(self, lines: bytes) -> None:
        """One or more complete lines (may hold many events, and blank or comment lines); an
        unterminated last line is completed by the next feed."""
        chunks = self._chunks
        if chunks is None:
            return
        self._size += len(lines)
        if self._size > MAX_STREAM_BYTES:
            self._chunks = None
            return
        chunks.append(lines)

    def answer(self) -> CachedAnswer | None:
        """The stream's answer; None unless exactly choice index 0 was seen, text only (no tool
        call deltas), a finish_reason of stop/length, and no error event."""
        if self._chunks is None:
            return None
        payloads = [line[5:].strip() for line in b"".join(self._chunks).split(b"\n")
                    if line.startswith(b"data:")]
        payloads = [p for p in payloads if p != b"[DONE]"]
        if not payloads:
            return None
        try:
            events = orjson.loads(b"[" + b",".join(payloads) + b"]")
        except orjson.JSONDecodeError:
            return None  # a line that is not JSON: not a stream the cache can replay
        return _answer_of(self._kind, events)


def _answer_of(kind: Kind, events: list[Any]) -> CachedAnswer | None:
    pieces: list[str] = []
    model: str | None = None
    finish_reason: str | None = None  # the last non-null one
    usage: dict[str, Any] = {}
    seen = False  # a choice with index 0 arrived
    fingerprint: str | None = None
    for event in events:
        if not isinstance(event, dict) or "error" in event:
            return None
        if model is None and isinstance(event.get("model"), str):
            model = event["model"]
        fingerprint = fingerprint or _fingerprint(event)
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        choices = event.get("choices", [])
        if not isinstance(choices, list):
            return None
        for choice in choices:
            text = choice_text(kind, choice, "delta")
            if text is UNREPLAYABLE:
                return None
            seen = True
            if isinstance(text, str) and text:
                pieces.append(text)
            if isinstance(choice.get("finish_reason"), str):
                finish_reason = choice["finish_reason"]
    if not seen or model is None or finish_reason not in _FINISH_REASONS:
        return None
    assert finish_reason is not None
    return CachedAnswer(kind=kind, model=model, text="".join(pieces), finish_reason=finish_reason,
                        prompt_tokens=_token_count(usage.get("prompt_tokens")),
                        completion_tokens=_token_count(usage.get("completion_tokens")),
                        fingerprint=fingerprint,
                        cuts=tuple(len(piece) for piece in pieces) if pieces else None)


def render_json(answer: CachedAnswer, *, response_id: str, created: int) -> bytes:
    """The OpenAI response body for `answer` (usage omitted when its counts are unknown)."""
    choice: dict[str, Any]
    if answer.kind == "chat":
        obj = "chat.completion"
        choice = {"index": 0, "message": {"role": "assistant", "content": answer.text},
                  "logprobs": None, "finish_reason": answer.finish_reason}
    else:
        obj = "text_completion"
        choice = {"index": 0, "text": answer.text, "logprobs": None,
                  "finish_reason": answer.finish_reason}
    body: dict[str, Any] = {"id": response_id, "object": obj, "created": created,
                            "model": answer.model, "choices": [choice]}
    if answer.fingerprint is not None:  # the weights that wrote it, as the backend said
        body["system_fingerprint"] = answer.fingerprint
    usage = usage_of(answer)
    if usage is not None:
        body["usage"] = usage
    return orjson.dumps(body)


class EventWriter:
    """OpenAI stream chunks for one answer, as the text comes: `start`, a `piece` per piece of
    text, then `end` with the whole answer (its finish reason and usage). With `include_usage`
    every chunk carries `"usage": null` and a usage-only chunk (`"choices": []`) precedes
    `[DONE]`; it is left out when the counts are unknown, as the cache has nothing true to say."""

    __slots__ = ("_chat", "_head", "_include_usage")

    def __init__(self, kind: Kind, model: str, *, response_id: str, created: int,
                 include_usage: bool, fingerprint: str | None = None) -> None:
        self._chat = kind == "chat"
        self._head: dict[str, Any] = {
            "id": response_id, "object": "chat.completion.chunk" if self._chat
            else "text_completion", "created": created, "model": model}
        if fingerprint is not None:
            self._head["system_fingerprint"] = fingerprint
        self._include_usage = include_usage

    def start(self) -> bytes:
        """A chat stream's first chunk (the assistant's role); nothing for a completion."""
        return self._choice({"role": "assistant", "content": ""}, None) if self._chat else b""

    def piece(self, text: str) -> bytes:
        return self._choice({"content": text} if self._chat else text, None)

    def end(self, answer: CachedAnswer) -> list[bytes]:
        """The last events: the finish reason, the usage when asked for, `[DONE]`."""
        events = [self._choice({} if self._chat else "", answer.finish_reason)]
        usage = usage_of(answer)
        if self._include_usage and usage is not None:
            events.append(b"data: " + orjson.dumps({**self._head, "choices": [], "usage": usage})
                          + b"\n\n")
        events.append(_DONE_EVENT)
        return events

    def _choice(self, content: dict[str, str] | str, finish_reason: str | None) -> bytes:
        if isinstance(content, dict):
            choice: dict[str, Any] = {"index": 0, "delta": content}
        else:
            choice = {"index": 0, "text": content}
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        chunk = {**self._head, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


def render_events(answer: CachedAnswer, *, response_id: str, created: int,
                  include_usage: bool) -> list[bytes]:
    """The OpenAI event stream for `answer` (`EventWriter`), one SSE event per item, ending with
    `[DONE]`: one event per piece of text the backend streamed (`CachedAnswer.pieces`)."""
    writer = EventWriter(answer.kind, answer.model, response_id=response_id, created=created,
                         include_usage=include_usage, fingerprint=answer.fingerprint)
    start = writer.start()
    return ([start] if start else []) + [writer.piece(piece) for piece in answer.pieces()] \
        + writer.end(answer)


def split_text(text: str) -> list[str]:
    """`text` in pieces of a word with the whitespace after it; "".join(pieces) == text."""
    return _PIECE.findall(text)


UNREPLAYABLE = object()  # `choice_text`: a choice the cache cannot replay


def choice_text(kind: Kind, choice: object, field: str) -> object:
    """The text of one choice (`field`: "message" in a body, "delta" in a stream): a str, None
    (a chunk without text), or UNREPLAYABLE (another index, tool calls, a refusal, reasoning,
    text that is not a string)."""
    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
        return UNREPLAYABLE
    if kind == "chat":
        message = choice.get(field)
        if not isinstance(message, dict) or _has_uncacheable(message):
            return UNREPLAYABLE
        text = message.get("content")
    else:
        text = choice.get("text")
    return text if text is None or isinstance(text, str) else UNREPLAYABLE


def _has_uncacheable(message: dict[str, Any]) -> bool:
    """Whether a chat message or delta carries something besides its text (tool calls, a
    refusal, reasoning); empty values (vLLM's `"tool_calls": []`) do not count."""
    if message.keys() <= _PLAIN:  # nearly every delta: once per streamed token, so fast first
        return False
    return any(message.get(key) for key in _UNCACHEABLE)


def _token_count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def usage_of(answer: CachedAnswer) -> dict[str, int] | None:
    """The OpenAI usage object of `answer`, or None when its token counts are unknown."""
    if answer.prompt_tokens is None or answer.completion_tokens is None:
        return None
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens}
