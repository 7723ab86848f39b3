"""OpenAI request bodies as the gateway validates them at the edge.

The fields OpenAI's API defines are checked as it checks them, field by field on the decoded
dict: their types, OpenAI's ranges (temperature 0 to 2, the penalties -2 to 2, a logit bias -100
to 100) and the roles. A count a backend can be configured past (how many stop strings, how many
logprobs) is only checked to be one, and every field OpenAI does not define (vLLM's `top_k`,
`ignore_eos`, ...) is allowed and left to the backend (the original bytes are forwarded).
Nothing is turned into a model of the body's whole tree: a conversation is bounded by
`max_messages`, and each message costs a few dict lookups, so no valid body holds the event
loop for long. A failed check becomes a 400 naming the first field that failed in OpenAI's style
(`messages[0].role`), worded as pydantic words it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest

# The roles OpenAI's chat API accepts ("function" is its deprecated form of "tool").
ROLES = ("system", "developer", "user", "assistant", "tool", "function")

_MISSING = object()
_REQUIRED = "Field required"
_NOT_STRING = "Input should be a valid string"
_EMPTY_STRING = "String should have at least 1 character"
_NOT_BOOL = "Input should be a valid boolean"
_NOT_INT = "Input should be a valid integer"
_BELOW_ONE = "Input should be greater than or equal to 1"
_NOT_LIST = "Input should be a valid list"
_NOT_DICT = "Input should be a valid dictionary"
# OpenAI's `response_format.type`s.
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


@dataclass(frozen=True, slots=True)
class Fields:
    """What the gateway reads of a valid completion body."""

    model: str
    stream: bool
    include_usage: bool  # stream_options.include_usage
    output_cap: int | None  # chat: max_completion_tokens or max_tokens; text: max_tokens
    n: int | None


class _Invalid(Exception):
    def __init__(self, loc: tuple[int | str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


def validate_chat(data: dict[str, Any], *, max_messages: int) -> Fields:
    """A chat completion body's fields; InvalidRequest naming the first that is wrong."""
    return _validated(lambda: _chat(data, max_messages))


def validate_completion(data: dict[str, Any]) -> Fields:
    """A (legacy) completion body's fields; InvalidRequest naming the first that is wrong."""
    return _validated(lambda: _completion(data))


Validator = Callable[[dict[str, Any]], Fields]


def _validated(check: Callable[[], Fields]) -> Fields:
    try:
        return check()
    except _Invalid as exc:
        param = field_path(exc.loc)
        raise InvalidRequest(f"{param}: {exc.message}", param=param) from None


def _chat(data: dict[str, Any], max_messages: int) -> Fields:
    common = _common(data)
    messages = data.get("messages", _MISSING)
    if messages is _MISSING:
        raise _Invalid(("messages",), _REQUIRED)
    if not isinstance(messages, list):
        raise _Invalid(("messages",), _NOT_LIST)
    if not messages:
        raise _Invalid(("messages",), "List should have at least 1 item after validation, not 0")
    if len(messages) > max_messages:
        raise _Invalid(("messages",), f"at most {max_messages} messages are accepted in one "
                                      f"request, not {len(messages)} (server.max_messages)")
    for index, message in enumerate(messages):
        _message(index, message)
    cap = _positive_int(data, "max_completion_tokens")
    _chat_options(data)
    return Fields(common.model, common.stream, common.include_usage,
                  cap or common.output_cap, common.n)


def _completion(data: dict[str, Any]) -> Fields:
    common = _common(data)
    prompt = data.get("prompt", _MISSING)
    if prompt is _MISSING:
        raise _Invalid(("prompt",), _REQUIRED)
    if not _prompt_ok(prompt):
        raise _Invalid(("prompt",), "Value error, must be a string, a list of strings, a list "
                                    "of token ids or a list of token-id lists")
    _optional(data, "logprobs", _is_int, _NOT_INT)
    _at_least(data, "logprobs", 0)
    _optional(data, "echo", _is_bool, _NOT_BOOL)
    _positive_int(data, "best_of")
    _optional(data, "suffix", _is_str, _NOT_STRING)
    return common


def _common(data: dict[str, Any]) -> Fields:
    """The fields both endpoints share, in their order."""
    model = data.get("model", _MISSING)
    if model is _MISSING:
        raise _Invalid(("model",), _REQUIRED)
    if not isinstance(model, str):
        raise _Invalid(("model",), _NOT_STRING)
    if not model:
        raise _Invalid(("model",), _EMPTY_STRING)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise _Invalid(("stream",), _NOT_BOOL)
    include_usage = False
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _Invalid(("stream_options",),
                           "Input should be a valid dictionary or instance of StreamOptions")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _Invalid(("stream_options", "include_usage"), _NOT_BOOL)
        include_usage = bool(usage)
    max_tokens = _positive_int(data, "max_tokens")
    n = _positive_int(data, "n")
    for name, high in (("temperature", 2), ("top_p", 1)):
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
            raise _Invalid((name,), f"Value error, must be a number from 0 to {high}, "
                                    f"not {value!r}")
    seed = data.get("seed")
    if seed is not None and not _is_int(seed):
        raise _Invalid(("seed",), _NOT_INT)
    for name in ("frequency_penalty", "presence_penalty"):
        _number_from((name,), data.get(name), -2, 2)
    bias = data.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise _Invalid(("logit_bias",), _NOT_DICT)
        for token, value in bias.items():
            _number_from(("logit_bias", token), value, -100, 100, required=True)
    stop = data.get("stop")
    if not (stop is None or isinstance(stop, str)
            or isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _Invalid(("stop",), "Value error, must be a string, a list of strings or null")
    _optional(data, "user", _is_str, _NOT_STRING)
    return Fields(model, stream, include_usage, max_tokens, n)


def _chat_options(data: dict[str, Any]) -> None:
    """The chat fields the gateway does not read itself, in the order of OpenAI's reference."""
    _optional(data, "logprobs", _is_bool, _NOT_BOOL)
    _optional(data, "top_logprobs", _is_int, _NOT_INT)
    _at_least(data, "top_logprobs", 0)
    _optional(data, "parallel_tool_calls", _is_bool, _NOT_BOOL)
    form = data.get("response_format")
    if form is not None:
        if not isinstance(form, dict):
            raise _Invalid(("response_format",), _NOT_DICT)
        kind = form.get("type", _MISSING)
        if kind is _MISSING:
            raise _Invalid(("response_format", "type"), _REQUIRED)
        if kind not in RESPONSE_FORMATS:
            raise _Invalid(("response_format", "type"), "Value error, must be one of "
                           f"{', '.join(RESPONSE_FORMATS)}, not {kind!r}")
    tools = data.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _Invalid(("tools",), _NOT_LIST)
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise _Invalid(("tools", index), _NOT_DICT)
    choice = data.get("tool_choice")
    if not (choice is None or isinstance(choice, str | dict)):
        raise _Invalid(("tool_choice",), "Value error, must be a string, an object or null")


def _optional(data: dict[str, Any], name: str, check: Callable[[object], bool],
              message: str) -> None:
    """`name` absent, null, or passing `check`."""
    value = data.get(name)
    if value is not None and not check(value):
        raise _Invalid((name,), message)


def _at_least(data: dict[str, Any], name: str, low: int) -> None:
    value = data.get(name)
    if value is not None and value < low:
        raise _Invalid((name,), f"Input should be greater than or equal to {low}")


def _number_from(loc: tuple[int | str, ...], value: object, low: float, high: float, *,
                 required: bool = False) -> None:
    """`value` (at `loc`) a number from `low` to `high`; null too unless `required`."""
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not low <= value <= high:
        raise _Invalid(loc, f"Value error, must be a number from {low} to {high}, not {value!r}")


def _message(index: int, message: object) -> None:
    if not isinstance(message, dict):
        raise _Invalid(("messages", index),
                       "Input should be a valid dictionary or instance of ChatMessage")
    role = message.get("role", _MISSING)
    if role is _MISSING:
        raise _Invalid(("messages", index, "role"), _REQUIRED)
    if not isinstance(role, str):
        raise _Invalid(("messages", index, "role"), _NOT_STRING)
    if not role:
        raise _Invalid(("messages", index, "role"), _EMPTY_STRING)
    if role not in ROLES:
        raise _Invalid(("messages", index, "role"),
                       f"Value error, must be one of {', '.join(ROLES)}, not {role!r}")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        return
    raise _Invalid(("messages", index, "content"),
                   "Value error, must be a string, a list of content parts (objects) or null")


def _positive_int(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise _Invalid((name,), _NOT_INT)
    if value < 1:
        raise _Invalid((name,), _BELOW_ONE)
    return int(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _prompt_ok(value: object) -> bool:
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or not value:
        return False
    if all(isinstance(p, str) for p in value):
        return True
    if all(_is_int(t) for t in value):
        return True
    return all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in value)


def decode_object(raw: bytes | bytearray) -> dict[str, Any]:
    """The JSON object in a request body; InvalidRequest if it is not one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    return data


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
