"""One completion request as the gateway handles it: the `Exchange`, built once and passed down.

The completion path (gateway/complete.py) builds it at arrival, fills in `asked` once the body is
valid, and records on it what each step decided (the model, the cache's verdict, the proxy's
`Outcome`). Every step that needs the request takes the exchange as an argument: nothing is
stored on the aiohttp request, nothing is looked up again. Response headers
(gateway/headers.py), telemetry (gateway/observe.py), token-budget settlement and the cache's
store side read it once, when the request ends.

Who is asking: with API keys on, the tenant is the key's (gateway/auth.py); without, the
`x-kvgate-tenant` header, else a hash of the Authorization bearer token (never the token
itself), else "anonymous". The priority class is the priority header (an integer, higher
first, default 0); the session is the configured session header, else the body's `user` field.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.attempt import Outcome
from gateway.cache.keys import Kind
from gateway.errors import InvalidRequest
from gateway.telemetry import RequestTiming, RequestTrace
from gateway.telemetry.outcome import CACHE_BYPASS
from routing.dispatch import DEFAULT_TENANT, Job
from routing.prefix import conversation_text

MAX_PRIORITY = 1_000_000  # |priority| beyond this is a client error, not a class
MAX_REQUEST_ID_LEN = 128


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    kind: Kind  # the cache's name for it
    operation: str  # gen_ai.operation.name


CHAT = Endpoint("/v1/chat/completions", "chat", "chat")
TEXT = Endpoint("/v1/completions", "text", "text_completion")


@dataclass(frozen=True, slots=True)
class Asked:
    """The request body, validated and read once."""

    raw: bytes | bytearray  # the client's bytes, forwarded unchanged when nothing needs rewriting
    data: dict[str, Any]  # the decoded body (the cache key and re-encoding read it)
    model: str  # the model the client named (maybe an alias)
    stream: bool
    include_usage: bool  # the client asked for a stream's usage event
    output_cap: int | None  # max_completion_tokens or max_tokens
    choices: int  # the body's `n`
    prompt_text: str | None  # the prompt's text, one content per line; None for token ids
    conversation: str  # the canonical text the model reads (`prompt_of`): routing's prompt
    prompt_tokens: int | None  # exact, when the client sent token ids
    user_turns: int  # chat: how many user messages; completions: 1
    tenant: str


@dataclass(slots=True)
class Exchange:
    """One completion request. Set at arrival: `request_id`, `endpoint`, `headers`, `timing`,
    `trace`; the rest by the completion path (its one writer) as the request moves, except the
    timing marks, which each step that takes time sets itself."""

    request_id: str
    endpoint: Endpoint
    headers: Mapping[str, str]  # the client's request headers
    timing: RequestTiming
    trace: RequestTrace
    keep_prompt: bool = False  # prompt logging is on: the access log may show `asked.prompt_text`
    asked: Asked | None = None  # None until the body is valid
    small_model: bool | None = None  # small-model routing's choice; None when no choice was made
    model_reason: str | None = None  # its reason (x-kvgate-model-reason)
    cache: str = CACHE_BYPASS  # "bypass" while no lookup ran, "miss", or the tier that answered
    hit_model: str | None = None  # a cache answer's: the model that wrote it, and its usage
    hit_usage: dict[str, Any] | None = None
    outcome: Outcome | None = None  # the proxy's record, once the request reached it


def request_id_of(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` when it is printable and not too long, else a fresh one."""
    given = headers.get("x-request-id", "")
    ok = 0 < len(given) <= MAX_REQUEST_ID_LEN and given.isprintable()
    return given if ok else uuid.uuid4().hex


def tenant_of(headers: Mapping[str, str], tenant_header: str) -> str:
    given = headers.get(tenant_header, "").strip()
    if given:
        return given[:128]
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        return f"key-{digest[:16]}"
    return DEFAULT_TENANT


def priority_of(headers: Mapping[str, str], priority_header: str) -> int:
    raw = headers.get(priority_header)
    if raw is None or not raw.strip():
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        value = MAX_PRIORITY + 1
    if abs(value) > MAX_PRIORITY:
        raise InvalidRequest(f"header {priority_header}: must be an integer priority class, "
                             f"got {raw!r}", param=priority_header)
    return value


def prompt_of(body: Mapping[str, Any]) -> tuple[str, int | None]:
    """(canonical prompt text, exact prompt tokens when the client sent token ids). Chat: the
    conversation's roles and text (text parts of multi-part contents); completions: the prompt
    string(s)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        pairs: list[tuple[str, str]] = []
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content
                                  if isinstance(part, Mapping)
                                  and isinstance(part.get("text"), str))
            pairs.append((str(message.get("role", "")),
                          content if isinstance(content, str) else ""))
        return conversation_text(pairs), None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt), None
        if all(isinstance(t, int) for t in prompt):
            return "", len(prompt)
        return "", sum(len(p) for p in prompt if isinstance(p, list))
    return "", None


def prompt_text(body: Mapping[str, Any]) -> str | None:
    """The prompt as text: chat messages' text (string contents and text parts) one per line, or
    a completion's prompt string(s). None when there is no text (token ids). What the token
    estimate, small-model routing and the access log read."""
    pieces: list[str] = []
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                pieces.append(content)
            elif isinstance(content, list):
                pieces.extend(
                    part["text"]
                    for part in content
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        pieces.append(prompt)
    elif isinstance(prompt, list):
        pieces.extend(p for p in prompt if isinstance(p, str))
    return "\n".join(pieces) if pieces else None


def user_turns(body: Mapping[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 1
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")


def job_of(ex: Exchange, asked: Asked, model: str, *, priority_header: str,
           session_header: str | None) -> Job:
    """What admission and routing decide on, for `asked` sent to `model`. InvalidRequest when
    the priority header is not a class."""
    session: str | None = None
    if session_header is not None:
        session = ex.headers.get(session_header) or None
    user = asked.data.get("user")
    if session is None and isinstance(user, str) and user:
        session = user
    salt = asked.data.get("cache_salt")
    min_tokens, ignore_eos = length_terms(asked.data)
    return Job(
        request_id=ex.request_id, model=model, prompt=asked.conversation,
        max_tokens=asked.output_cap, prompt_tokens=asked.prompt_tokens,
        priority=priority_of(ex.headers, priority_header), tenant=asked.tenant,
        session=session, cache_salt=salt if isinstance(salt, str) else None,
        stream=asked.stream,
        min_tokens=min_tokens, ignore_eos=ignore_eos,
    )


def length_terms(body: Mapping[str, Any]) -> tuple[int, bool]:
    """vLLM's `min_tokens` (a positive integer, else 0) and `ignore_eos` (only `true` counts):
    what bounds the reply's length beside its max_tokens."""
    floor = body.get("min_tokens")
    if not isinstance(floor, int) or isinstance(floor, bool) or floor < 0:
        floor = 0
    return floor, body.get("ignore_eos") is True
