"""Completion bodies are checked field by field: the first wrong field, in the order of OpenAI's
reference, is named in a 400; the conversation is bounded by max_messages; everything else is
left to the backend."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.schemas import Fields, validate_chat, validate_completion

USER = {"role": "user", "content": "hi"}
MAX_MESSAGES = 10


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER]} | fields


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        pytest.param({"messages": [USER]}, "model", "Field required", id="model is required"),
        pytest.param(chat(model=3), "model", "Input should be a valid string",
                     id="model must be a string"),
        pytest.param(chat(model=""), "model", "at least 1 character", id="model must not be empty"),
        pytest.param(chat(stream="yes"), "stream", "valid boolean", id="stream must be a boolean"),
        pytest.param(chat(stream=None), "stream", "valid boolean", id="stream may not be null"),
        pytest.param(chat(stream_options=[]), "stream_options", "valid dictionary",
                     id="stream_options must be an object"),
        pytest.param(chat(stream_options={"include_usage": 1}), "stream_options.include_usage",
                     "valid boolean", id="include_usage must be a boolean"),
        pytest.param(chat(max_tokens=0), "max_tokens", "greater than or equal to 1",
                     id="max_tokens at least 1"),
        pytest.param(chat(max_tokens=True), "max_tokens", "valid integer",
                     id="max_tokens is no boolean"),
        pytest.param(chat(n=1.5), "n", "valid integer", id="n must be an integer"),
        pytest.param(chat(temperature="hot"), "temperature", "from 0 to 2",
                     id="temperature must be a number"),
        pytest.param(chat(temperature=2.5), "temperature", "from 0 to 2", id="temperature over 2"),
        pytest.param(chat(top_p=1.5), "top_p", "from 0 to 1", id="top_p over 1"),
        pytest.param(chat(seed="7"), "seed", "valid integer", id="seed must be an integer"),
        pytest.param({"model": "m"}, "messages", "Field required", id="messages are required"),
        pytest.param(chat(messages={}), "messages", "valid list", id="messages must be a list"),
        pytest.param(chat(messages=[]), "messages", "at least 1 item", id="messages not empty"),
        pytest.param(chat(messages=[USER] * (MAX_MESSAGES + 1)), "messages",
                     f"at most {MAX_MESSAGES} messages", id="no more than max_messages"),
        pytest.param(chat(messages=[USER, "x"]), "messages[1]", "valid dictionary",
                     id="a message must be an object"),
        pytest.param(chat(messages=[{"content": "x"}]), "messages[0].role", "Field required",
                     id="a message needs a role"),
        pytest.param(chat(messages=[{"role": 7}]), "messages[0].role", "valid string",
                     id="a role is a string"),
        pytest.param(chat(messages=[{"role": "wizard"}]), "messages[0].role", "must be one of",
                     id="a role OpenAI knows"),
        pytest.param(chat(messages=[USER, {"role": "user", "content": 5}]),
                     "messages[1].content", "content parts", id="content of the wrong type"),
        pytest.param(chat(messages=[{"role": "user", "content": ["x"]}]),
                     "messages[0].content", "content parts", id="content parts are objects"),
        pytest.param(chat(model=3, stream="x"), "model", "valid string",
                     id="the first wrong field is named"),
        pytest.param(chat(max_completion_tokens=0), "max_completion_tokens", "greater than",
                     id="max_completion_tokens at least 1"),
    ],
)
def test_a_wrong_chat_field_is_named(body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_chat(body, max_messages=MAX_MESSAGES)
    assert info.value.param == param
    assert message in info.value.message and info.value.message.startswith(param + ": ")


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        pytest.param(chat(), Fields("m", False, False, None, None), id="the defaults"),
        pytest.param(chat(stream=True, stream_options={"include_usage": True}, n=2,
                          max_tokens=5, max_completion_tokens=9, temperature=1, top_p=0.5,
                          seed=3, tools=[{"anything": True}]),
                     Fields("m", True, True, 9, 2),
                     id="max_completion_tokens wins; unknown fields pass"),
        pytest.param(chat(messages=[USER] * MAX_MESSAGES, stream_options=None),
                     Fields("m", False, False, None, None), id="exactly max_messages"),
        pytest.param(chat(messages=[{"role": "tool", "content": None},
                                    {"role": "user", "content": [{"type": "text"}]}]),
                     Fields("m", False, False, None, None), id="null and multi-part contents"),
    ],
)
def test_a_valid_chat_body_gives_its_fields(body: dict[str, Any], fields: Fields) -> None:
    assert validate_chat(body, max_messages=MAX_MESSAGES) == fields


@pytest.mark.parametrize(
    ("prompt", "valid"),
    [
        pytest.param("text", True, id="a string"),
        pytest.param(["a", "b"], True, id="strings"),
        pytest.param([1, 2, 3], True, id="token ids"),
        pytest.param([[1, 2], [3]], True, id="token-id lists"),
        pytest.param([], False, id="not empty"),
        pytest.param([True, False], False, id="booleans are no token ids"),
        pytest.param({"not": "a prompt"}, False, id="no object"),
        pytest.param(None, False, id="not null"),
    ],
)
def test_a_completion_prompt_has_one_of_openais_shapes(prompt: object, valid: bool) -> None:
    body = {"model": "m", "prompt": prompt, "max_tokens": 4}
    if valid:
        assert validate_completion(body) == Fields("m", False, False, 4, None)
        return
    with pytest.raises(InvalidRequest) as info:
        validate_completion(body)
    assert info.value.param == "prompt"


def test_a_completion_needs_a_prompt() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_completion({"model": "m"})
    assert (info.value.param, info.value.message) == ("prompt", "prompt: Field required")
