"""The simulator's OpenAI-compatible surface, as pure code: request bodies, prompt rendering,
errors, and the bytes of responses and stream chunks.

Shapes follow vLLM's OpenAI server (see /work/shared/fixtures/vllm-chat-stream.sse): a chat stream
opens with a chunk whose delta is `{"role": "assistant", "content": ""}`, sends one chunk per
token, then a chunk with empty content carrying `finish_reason` and `stop_reason`, then (with
`stream_options.include_usage`) a chunk with `choices: []` and usage, then `data: [DONE]`.
Errors are vLLM's (>= 0.10.1) OpenAI-shaped bodies with an integer `code`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadtest.sim.tokens import tokenize

# A non-text content part (an image, audio) costs this many prompt tokens, whatever its size:
# LLaVA-1.5's 336x336 image at 14-pixel patches.
MEDIA_PART_TOKENS = 576
TEXT_PART_TYPES = frozenset({"text", "input_text"})


_ERROR_TYPES = {404: "NotFoundError", 500: "InternalServerError"}


class SimError(Exception):
    """A request the simulator refuses; the app's middleware turns it into an OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @property
    def error_type(self) -> str:
        return _ERROR_TYPES.get(self.status, "BadRequestError")

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.error_type,
                                       "param": self.param, "code": self.status}})


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class _Body(BaseModel):
    """Fields both endpoints read; anything else a client sends is accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension: no EOS before this many tokens


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]


BodyT = TypeVar("BodyT", ChatCompletionRequest, CompletionRequest)


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A prompt as the engine sees it. `key` identifies its content (it seeds the output)."""

    tokens: tuple[int, ...]
    key: bytes


def parse_body(raw: bytes, model: type[BodyT]) -> BodyT:
    """Decode and validate a request body, or raise SimError(400) naming the problem."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SimError(400, f"Invalid JSON body: {exc}") from exc
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        raise SimError(400, f"Invalid request: {details}") from exc
    if body.n > 1:
        raise SimError(400, "n > 1 is not supported by the simulator.", param="n")
    if body.stream_options is not None and not body.stream:
        raise SimError(400, "Stream options can only be defined when `stream=True`.",
                       param="stream_options")
    return body


def _media_tokens(part: ContentPart) -> tuple[str, list[int]]:
    """A media part's placeholder text and its fixed-size, content-derived token ids."""
    digest = zlib.crc32(orjson.dumps(part.model_dump(), option=orjson.OPT_SORT_KEYS))
    return f"<|{part.type}:{digest:08x}|>", [(digest + i) & 0x7FFFFFFF
                                             for i in range(MEDIA_PART_TOKENS)]


def render_chat(messages: list[ChatMessage]) -> RenderedPrompt:
    """A fixed template: `<|role|>\\n` + content + `\\n` per message, then `<|assistant|>\\n`.

    Text parts of a list content are concatenated; every other part costs MEDIA_PART_TOKENS.
    """
    text: list[str] = []
    tokens: list[int] = []

    def add(segment: str) -> None:
        text.append(segment)
        tokens.extend(tokenize(segment))

    for message in messages:
        add(f"<|{message.role}|>\n")
        content = message.content
        if isinstance(content, str):
            add(content)
        elif content is not None:
            for part in content:
                if part.type in TEXT_PART_TYPES:
                    add(part.text or "")
                else:
                    placeholder, ids = _media_tokens(part)
                    text.append(placeholder)
                    tokens.extend(ids)
        add("\n")
    add("<|assistant|>\n")
    return RenderedPrompt(tuple(tokens), "".join(text).encode())


def render_completion(prompt: str | list[int] | list[str] | list[list[int]]) -> RenderedPrompt:
    """A completions prompt: a string or a list of token ids; a batch of one is unwrapped."""
    item: object = prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) > 1:
            raise SimError(400, "Batched prompts are not supported by the simulator.",
                           param="prompt")
        item = prompt[0]
    if isinstance(item, str):
        return RenderedPrompt(tuple(tokenize(item)), item.encode())
    ids = tuple(int(t) for t in item) if isinstance(item, list) else ()
    return RenderedPrompt(ids, b"ids:" + ",".join(map(str, ids)).encode())


def resolve_max_tokens(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    """The output cap vLLM would use, or SimError(400) when the request cannot fit the context."""
    if prompt_len >= max_model_len:
        raise SimError(400, f"This model's maximum context length is {max_model_len} tokens. "
                            f"However, your request has {prompt_len} input tokens. Please reduce "
                            "the length of the input messages.")
    if requested is None:
        return max_model_len - prompt_len
    if prompt_len + requested > max_model_len:
        raise SimError(400, f"This model's maximum context length is {max_model_len} tokens. "
                            f"However, you requested {prompt_len + requested} tokens "
                            f"({prompt_len} in the messages, {requested} in the completion). "
                            "Please reduce the length of the messages or completion.")
    return requested


Kind = Literal["chat", "text"]


class ChunkEncoder:
    """Stream chunks of one response as SSE bytes; everything constant is encoded once."""

    __slots__ = ("_head", "_kind", "_token_pre", "_token_post")

    def __init__(self, kind: Kind, request_id: str, created: int, model: str) -> None:
        self._kind = kind
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        head = orjson.dumps({"id": request_id, "object": obj, "created": created, "model": model})
        self._head = b"data: " + head[:-1]  # without the closing brace
        if kind == "chat":
            self._token_pre = self._head + b',"choices":[{"index":0,"delta":{"content":'
            self._token_post = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._token_pre = self._head + b',"choices":[{"index":0,"text":'
            self._token_post = b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'

    def role(self) -> bytes:
        """The chunk a chat stream opens with (text completions have none)."""
        return (self._head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]}\n\n')

    def token(self, piece: str) -> bytes:
        return self._token_pre + orjson.dumps(piece) + self._token_post

    def finish(self, reason: str) -> bytes:
        field = b'"delta":{"content":""}' if self._kind == "chat" else b'"text":""'
        return (self._head + b',"choices":[{"index":0,' + field + b',"logprobs":null,'
                b'"finish_reason":' + orjson.dumps(reason) + b',"stop_reason":null}]}\n\n')

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return (self._head + b',"choices":[],"usage":' + orjson.dumps(
            _usage(prompt_tokens, completion_tokens)) + b"}\n\n")


DONE = b"data: [DONE]\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    # vLLM's field order.
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens}


def completion_body(kind: Kind, request_id: str, created: int, model: str, text: str,
                    finish_reason: str, prompt_tokens: int, completion_tokens: int) -> bytes:
    """A non-streaming response in vLLM's shape."""
    usage: dict[str, Any] = {**_usage(prompt_tokens, completion_tokens),
                             "prompt_tokens_details": None}
    if kind == "chat":
        return orjson.dumps({
            "id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0,
                         "message": {"role": "assistant", "content": text, "refusal": None,
                                     "annotations": None, "audio": None, "function_call": None,
                                     "tool_calls": [], "reasoning_content": None},
                         "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}],
            "service_tier": None, "system_fingerprint": None, "usage": usage,
            "prompt_logprobs": None, "kv_transfer_params": None,
        })
    return orjson.dumps({
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": None, "prompt_logprobs": None}],
        "usage": usage, "kv_transfer_params": None,
    })


def models_body(model: str, created: int, max_model_len: int) -> bytes:
    """`GET /v1/models` as vLLM answers it."""
    return orjson.dumps({"object": "list", "data": [{
        "id": model, "object": "model", "created": created, "owned_by": "vllm", "root": model,
        "parent": None, "max_model_len": max_model_len,
        "permission": [{"id": f"modelperm-{zlib.crc32(model.encode()):08x}",
                        "object": "model_permission", "created": created,
                        "allow_create_engine": False, "allow_sampling": True,
                        "allow_logprobs": True, "allow_search_indices": False,
                        "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                        "group": None, "is_blocking": False}],
    }]})
