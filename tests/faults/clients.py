"""Clients that judge every answer the gateway gives: a row's first claim is that no request is
lost, i.e. every client gets either an answer or an error it can parse.

An answer is one of:
- `ok`: a 200 JSON completion, or a 200 stream ending in `[DONE]` with no error event;
- `error`: an error status whose body is OpenAI's `{"error": {"message", "type", ...}}`, or a
  200 stream that ends with an SSE error event and then `[DONE]`;
- `lost`: anything else (a connection cut before an answer, a stream cut without an error
  event or without `[DONE]`, an error body that is not OpenAI's, no answer within the client's
  own deadline).
"""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

MODEL = "faulty-model"
CLIENT_DEADLINE_S = 60.0


@dataclass(frozen=True, slots=True)
class Answer:
    kind: str  # ok | error | lost
    status: int | None
    headers: Mapping[str, str] = field(default_factory=dict)
    why: str = ""  # what made it an error or lost
    backend: str | None = None
    message: str = ""  # an error's message


def chat_body(*, stream: bool = True, max_tokens: int = 8, text: str = "hello",
              **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}], **extra}


def is_openai_error(payload: object) -> bool:
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return False
    error = payload["error"]
    return isinstance(error.get("message"), str) and isinstance(error.get("type"), str)


def judge_json(status: int, headers: Mapping[str, str], body: bytes) -> Answer:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Answer("lost", status, headers, f"not JSON: {body[:120]!r}")
    if status == 200:
        ok = isinstance(payload, dict) and "choices" in payload
        return Answer("ok" if ok else "lost", status, headers, "" if ok else "no choices",
                      headers.get("x-kvgate-backend"))
    if is_openai_error(payload):
        return Answer("error", status, headers, str(payload["error"].get("code")),
                      headers.get("x-kvgate-backend"), payload["error"]["message"])
    return Answer("lost", status, headers, f"not an OpenAI error body: {body[:120]!r}")


def judge_stream(status: int, headers: Mapping[str, str], body: bytes) -> Answer:
    """A 200 stream's whole body: ok with `[DONE]` last and no error, error with an error event
    and then `[DONE]`, lost otherwise."""
    events = [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]
    backend = headers.get("x-kvgate-backend")
    if not events or events[-1] != b"[DONE]":
        return Answer("lost", status, headers, "the stream did not end with [DONE]", backend)
    errors = []
    for event in events[:-1]:
        try:
            payload = orjson.loads(event)
        except orjson.JSONDecodeError:
            return Answer("lost", status, headers, f"an event is not JSON: {event[:80]!r}",
                          backend)
        if isinstance(payload, dict) and "error" in payload:
            if not is_openai_error(payload):
                return Answer("lost", status, headers, f"a bad error event: {event[:80]!r}",
                              backend)
            errors.append(str(payload["error"].get("code")))
    if errors:
        return Answer("error", status, headers, errors[-1], backend)
    return Answer("ok", status, headers, "", backend)


async def send(http: aiohttp.ClientSession, url: str, body: Mapping[str, Any] | bytes, *,
               path: str = "/v1/chat/completions", headers: Mapping[str, str] | None = None,
               deadline_s: float = CLIENT_DEADLINE_S,
               on_first: Callable[[], None] | None = None) -> Answer:
    """POSTs one request and judges what comes back (a client's own deadline: lost past it);
    `on_first` is called when the first body bytes arrive."""
    raw_body = body if isinstance(body, bytes) else orjson.dumps(body)
    data: bytes | io.BytesIO = io.BytesIO(raw_body) if len(raw_body) > 1 << 20 else raw_body
    sent_headers = {"Content-Type": "application/json", **(headers or {})}
    try:
        async with asyncio.timeout(deadline_s), \
                http.post(url + path, data=data, headers=sent_headers) as resp:
            got = {k.lower(): v for k, v in resp.headers.items()}
            parts = []
            async for chunk in resp.content.iter_any():
                if on_first is not None and not parts:
                    on_first()
                parts.append(chunk)
            raw = b"".join(parts)
            if resp.status == 200 and got.get("content-type", "").startswith("text/event-stream"):
                return judge_stream(resp.status, got, raw)
            return judge_json(resp.status, got, raw)
    except TimeoutError:
        return Answer("lost", None, {}, f"no answer within {deadline_s} s")
    except aiohttp.ClientPayloadError as exc:
        return Answer("lost", None, {}, f"the body was cut: {exc}")
    except (aiohttp.ClientError, OSError) as exc:
        return Answer("lost", None, {}, f"{type(exc).__name__}: {exc}")


async def send_many(url: str, bodies: Iterable[Mapping[str, Any]],
                    **options: Any) -> list[Answer]:
    """Every body at once over one pool; the answers in order."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return list(await asyncio.gather(*(send(http, url, b, **options) for b in bodies)))


def assert_none_lost(answers: Iterable[Answer]) -> Counter[str]:
    """Fails naming the first lost answers; returns the count of each kind."""
    answers = list(answers)
    lost = [a for a in answers if a.kind == "lost"]
    assert not lost, f"{len(lost)} of {len(answers)} lost, e.g. {[a.why for a in lost[:3]]}"
    return Counter(a.kind for a in answers)


async def get_json(url: str, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url + path) as resp:
        return resp.status, orjson.loads(await resp.read())


async def metrics_text(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        return await resp.text()
