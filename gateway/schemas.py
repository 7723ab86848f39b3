"""OpenAI request bodies as the gateway validates them at the edge.

Only the fields the gateway itself relies on are checked; every other field is allowed and left to
the backend (the original bytes are forwarded). A failed check becomes a 400 naming the field in
OpenAI's style (`messages[0].role`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from gateway.errors import InvalidRequest


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


# The roles OpenAI's chat API accepts ("function" is its deprecated form of "tool").
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class ChatMessage(_Open):
    role: StrictStr = Field(min_length=1)
    content: Any = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in ROLES:
            raise ValueError(f"must be one of {', '.join(ROLES)}, not {value!r}")
        return value

    @field_validator("content")
    @classmethod
    def _content_shape(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(part, dict) for part in value):
            return value
        raise ValueError("must be a string, a list of content parts (objects) or null")


class _Completion(_Open):
    model: StrictStr = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    n: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = None  # 0 to 2, as OpenAI takes it
    top_p: float | None = None  # 0 to 1
    seed: StrictInt | None = None

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _sampling_range(cls, value: Any, info: ValidationInfo) -> Any:
        high = 2 if info.field_name == "temperature" else 1
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
            raise ValueError(f"must be a number from 0 to {high}, not {value!r}")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Completion):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)

    @property
    def output_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Completion):
    prompt: Any

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            if all(isinstance(p, str) for p in value):
                return value
            if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
                return value
            if all(
                isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in value
            ):
                return value
        raise ValueError(
            "must be a string, a list of strings, a list of token ids or a list of token-id lists"
        )

    @property
    def output_cap(self) -> int | None:
        return self.max_tokens


_C = TypeVar("_C", bound=_Completion)


def decode_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in a request body; InvalidRequest if it is not one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return data


def validate(model: type[_C], data: dict[str, Any]) -> _C:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = field_path(error["loc"])
        raise InvalidRequest(f"{param}: {error['msg']}", param=param) from exc


def field_path(loc: tuple[int | str, ...]) -> str:
    """OpenAI's way to name a field: `messages[0].content`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "body"


def model_list(model_ids: list[str], *, created: int) -> dict[str, Any]:
    """OpenAI's `GET /v1/models` answer."""
    return {
        "object": "list",
        "data": [
            {"id": mid, "object": "model", "created": created, "owned_by": "kvgate"}
            for mid in model_ids
        ],
    }
