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
        pytest.param(chat(frequency_penalty="a"), "frequency_penalty", "from -2 to 2",
                     id="frequency_penalty must be a number"),
        pytest.param(chat(presence_penalty=2.5), "presence_penalty", "from -2 to 2",
                     id="presence_penalty over 2"),
        pytest.param(chat(presence_penalty=-3), "presence_penalty", "from -2 to 2",
                     id="presence_penalty under -2"),
        pytest.param(chat(logit_bias=[1]), "logit_bias", "valid dictionary",
                     id="logit_bias must be an object"),
        pytest.param(chat(logit_bias={"50256": -101}), "logit_bias.50256", "from -100 to 100",
                     id="a logit bias from -100 to 100"),
        pytest.param(chat(logit_bias={"50256": None}), "logit_bias.50256", "from -100 to 100",
                     id="a logit bias is a number"),
        pytest.param(chat(stop=5), "stop", "a list of strings", id="stop must be text"),
        pytest.param(chat(stop=["a", 1]), "stop", "a list of strings",
                     id="every stop is a string"),
        pytest.param(chat(user=5), "user", "valid string", id="user must be a string"),
        pytest.param(chat(logprobs="x"), "logprobs", "valid boolean",
                     id="chat logprobs is a boolean"),
        pytest.param(chat(top_logprobs=1.5), "top_logprobs", "valid integer",
                     id="top_logprobs must be an integer"),
        pytest.param(chat(top_logprobs=-1), "top_logprobs", "greater than or equal to 0",
                     id="top_logprobs at least 0"),
        pytest.param(chat(parallel_tool_calls="yes"), "parallel_tool_calls", "valid boolean",
                     id="parallel_tool_calls is a boolean"),
        pytest.param(chat(response_format="json"), "response_format", "valid dictionary",
                     id="response_format must be an object"),
        pytest.param(chat(response_format={}), "response_format.type", "Field required",
                     id="response_format needs a type"),
        pytest.param(chat(response_format={"type": "yaml"}), "response_format.type",
                     "must be one of text, json_object, json_schema",
                     id="a response_format type OpenAI knows"),
        pytest.param(chat(tools=5), "tools", "valid list", id="tools must be a list"),
        pytest.param(chat(tools=[{"type": "function"}, "f"]), "tools[1]", "valid dictionary",
                     id="a tool is an object"),
        pytest.param(chat(tool_choice=5), "tool_choice", "a string, an object or null",
                     id="tool_choice is a string or an object"),
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
        pytest.param(chat(frequency_penalty=-2, presence_penalty=2.0, logit_bias={"7": -100},
                          stop=["a", "b", "c", "d", "e"], user="u", logprobs=True,
                          top_logprobs=30, parallel_tool_calls=False,
                          response_format={"type": "json_schema", "json_schema": {}},
                          tool_choice={"type": "function"}, top_k=40, ignore_eos=True),
                     Fields("m", False, False, None, None),
                     id="OpenAI's bounds, counts left to the backend, vLLM's own fields"),
        pytest.param(chat(stop="x", frequency_penalty=None, logit_bias=None, tools=None,
                          response_format=None, tool_choice="auto"),
                     Fields("m", False, False, None, None), id="null or plain options"),
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


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        pytest.param({"logprobs": True}, "logprobs", "valid integer",
                     id="a completion's logprobs is a count"),
        pytest.param({"logprobs": -1}, "logprobs", "greater than or equal to 0",
                     id="logprobs at least 0"),
        pytest.param({"echo": "no"}, "echo", "valid boolean", id="echo is a boolean"),
        pytest.param({"best_of": 0}, "best_of", "greater than or equal to 1",
                     id="best_of at least 1"),
        pytest.param({"suffix": 1}, "suffix", "valid string", id="suffix is a string"),
        pytest.param({"presence_penalty": 9}, "presence_penalty", "from -2 to 2",
                     id="the penalties' range holds for completions too"),
        pytest.param({"stop": {"a": 1}}, "stop", "a list of strings", id="completion stop"),
    ],
)
def test_a_wrong_completion_field_is_named(fields: dict[str, Any], param: str,
                                           message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_completion({"model": "m", "prompt": "p"} | fields)
    assert info.value.param == param
    assert message in info.value.message and info.value.message.startswith(param + ": ")


def test_a_completion_with_every_option_in_range_is_valid() -> None:
    body = {"model": "m", "prompt": "p", "logprobs": 10, "echo": True, "best_of": 2,
            "suffix": None, "stop": "\n", "frequency_penalty": 1, "user": "u"}
    assert validate_completion(body) == Fields("m", False, False, None, None)
