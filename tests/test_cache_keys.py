"""Cache keys: which requests share an answer, which compete for a semantic one, which bypass."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cache.keys import Bypass, CacheKey, Kind, cache_key

MODEL = "llama-3-8b"
SYSTEM = {"role": "system", "content": "You are terse."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}
CHAT: dict[str, Any] = {
    "model": "fast", "messages": [SYSTEM, QUESTION], "max_tokens": 64, "temperature": 0,
}
TEXT: dict[str, Any] = {
    "model": "fast", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.0,
}
TOOL = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def key(body: dict[str, Any], kind: Kind = "chat", model: str = MODEL, *,
        max_temperature: float | None = None) -> CacheKey:
    found = cache_key(kind, body, model, max_temperature=max_temperature)
    assert isinstance(found, CacheKey), found
    return found


def base(kind: Kind) -> dict[str, Any]:
    return CHAT if kind == "chat" else TEXT


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_key_names_the_resolved_model_and_kind_with_sha256_digests() -> None:
    found = key(CHAT)
    assert (found.model, found.kind) == (MODEL, "chat")
    assert len(found.id) == 64 and int(found.id, 16) >= 0
    assert len(found.namespace) == 64 and found.namespace != found.id


SAME_ID = [
    pytest.param("chat", {}, id="identical request, same id"),
    pytest.param("chat", {"stream": True}, id="streaming or not, same answer"),
    pytest.param("chat", {"stream": True, "stream_options": {"include_usage": True}},
                 id="stream_options do not change the answer"),
    pytest.param("chat", {"user": "alice"}, id="user does not change the answer"),
    pytest.param("chat", {"metadata": {"team": "a"}, "store": True, "service_tier": "auto"},
                 id="metadata, store and service_tier do not change the answer"),
    pytest.param("chat", {"model": "another-alias"}, id="client's alias gives way to the resolved"),
    pytest.param("chat", {"temperature": 0.0}, id="temperature 0 and 0.0 are one number"),
    pytest.param("chat", {"temperature": -0.0}, id="temperature -0.0 is 0"),
    pytest.param("text", {"temperature": 0}, id="text: temperature 0.0 and 0 are one number"),
    pytest.param("chat", {"max_tokens": 64.0}, id="max_tokens 64 and 64.0 are one number"),
]


@pytest.mark.parametrize(("kind", "change"), SAME_ID)
def test_requests_that_get_the_same_answer_share_an_id(kind: Kind, change: dict[str, Any]
                                                       ) -> None:
    assert key({**base(kind), **change}, kind).id == key(base(kind), kind).id


def test_field_order_does_not_change_the_id() -> None:
    shuffled = dict(reversed(list({**CHAT, "tools": [TOOL]}.items())))
    assert key(shuffled).id == key({**CHAT, "tools": [TOOL]}).id


def test_numbers_inside_nested_fields_are_normalised_too() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    as_float = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0.0}}}
    assert key({**CHAT, "response_format": schema}).id == key(
        {**CHAT, "response_format": as_float}).id


DIFFERENT_ID = [
    pytest.param("chat", {"messages": [SYSTEM, {"role": "user", "content": "What is the capital"
                                                " of Spain?"}]}, id="another question"),
    pytest.param("chat", {"messages": [QUESTION]}, id="no system prompt"),
    pytest.param("chat", {"messages": [SYSTEM, {**QUESTION, "name": "bob"}]},
                 id="a message field other than content"),
    pytest.param("chat", {"max_tokens": 65}, id="max_tokens"),
    pytest.param("chat", {"temperature": 0.7}, id="temperature"),
    pytest.param("chat", {"temperature": None}, id="temperature null is not 0"),
    pytest.param("chat", {"tools": [TOOL]}, id="tools"),
    pytest.param("chat", {"seed": 7}, id="seed"),
    pytest.param("chat", {"x_vendor_knob": 1}, id="an unknown field stays in the key"),
    pytest.param("chat", {"kind": "chat"}, id="a body field named kind is just a field"),
    pytest.param("chat", {"x_flag": True}, id="true is not the number 1 (bools stay bools)"),
    pytest.param("text", {"prompt": "Once upon a time,"}, id="text: another prompt"),
    pytest.param("text", {"prompt": ["Once upon a time"]}, id="text: prompt as a one-item list"),
    pytest.param("text", {"suffix": "The end."}, id="text: suffix"),
]


@pytest.mark.parametrize(("kind", "change"), DIFFERENT_ID)
def test_any_change_that_can_change_the_answer_changes_the_id(kind: Kind, change: dict[str, Any]
                                                             ) -> None:
    assert key({**base(kind), **change}, kind).id != key(base(kind), kind).id


def test_the_resolved_model_and_the_kind_are_in_the_id() -> None:
    assert key(CHAT, model="llama-3-70b").id != key(CHAT).id
    both = {**TEXT, "messages": CHAT["messages"]}
    assert key(both, "chat").id != key(both, "text").id


@pytest.mark.parametrize(("one", "other"), [
    pytest.param(2**60, 2**60 + 1, id="seeds beyond a float's precision stay apart"),
    pytest.param(2**53 + 1, float(2**53), id="an int no float holds is not its nearest float"),
    pytest.param(float("nan"), None, id="nan is not null"),
    pytest.param(float("inf"), float("-inf"), id="infinities stay apart"),
])
def test_numbers_that_differ_never_share_an_id(one: object, other: object) -> None:
    assert key({**CHAT, "seed": one}).id != key({**CHAT, "seed": other}).id


def test_an_integer_too_big_for_64_bits_still_has_a_key() -> None:
    assert key({**CHAT, "seed": 2**100}).id != key({**CHAT, "seed": 2**100 + 1}).id


BYPASS = [
    pytest.param("chat", {"n": 2}, None, "n", id="n above 1: several answers"),
    pytest.param("text", {"best_of": 3}, None, "best_of", id="best_of above 1"),
    pytest.param("chat", {"logprobs": True}, None, "logprobs", id="chat logprobs"),
    pytest.param("chat", {"logprobs": False, "top_logprobs": 0}, None, "logprobs",
                 id="top_logprobs set"),
    pytest.param("text", {"logprobs": 0}, None, "logprobs",
                 id="text logprobs 0 still returns the sampled tokens' logprobs"),
    pytest.param("text", {"echo": True}, None, "echo", id="echo repeats the prompt"),
    pytest.param("text", {"prompt": ["a", "b"]}, None, "prompt_list", id="two string prompts"),
    pytest.param("text", {"prompt": [[1, 2], [3]]}, None, "prompt_list",
                 id="two token-id prompts"),
    pytest.param("chat", {"temperature": 0.8}, 0.5, "temperature",
                 id="temperature above max_temperature"),
    pytest.param("chat", {"temperature": None}, 0.5, "temperature",
                 id="null temperature counts as 1.0"),
    pytest.param("text", {"temperature": 2}, 1.5, "temperature", id="text temperature above max"),
    pytest.param("chat", {"response_format": nested(300)}, None, "nesting",
                 id="a body nested too deep to encode"),
]


@pytest.mark.parametrize(("kind", "change", "max_temperature", "reason"), BYPASS)
def test_requests_whose_answer_the_cache_cannot_hold_bypass_it(
        kind: Kind, change: dict[str, Any], max_temperature: float | None, reason: str) -> None:
    assert cache_key(kind, {**base(kind), **change}, MODEL,
                     max_temperature=max_temperature) == Bypass(reason)


def test_an_absent_temperature_counts_as_openais_default_of_1() -> None:
    body = {name: value for name, value in CHAT.items() if name != "temperature"}
    assert cache_key("chat", body, MODEL, max_temperature=0.9) == Bypass("temperature")
    assert isinstance(cache_key("chat", body, MODEL, max_temperature=1.0), CacheKey)


CACHEABLE = [
    pytest.param("chat", {"n": 1, "best_of": 1}, None, id="one answer"),
    pytest.param("chat", {"n": None, "logprobs": None, "top_logprobs": None}, None,
                 id="nulls ask for nothing"),
    pytest.param("chat", {"logprobs": False, "echo": False}, None, id="explicit false"),
    pytest.param("chat", {"temperature": 0.5}, 0.5, id="temperature at max_temperature"),
    pytest.param("chat", {"temperature": 1.9}, None, id="no max_temperature, no limit"),
    pytest.param("text", {"prompt": ["one prompt"]}, None, id="a one-string prompt list"),
    pytest.param("text", {"prompt": [1, 2, 3]}, None, id="token ids are one prompt"),
    pytest.param("text", {"prompt": [[1, 2, 3]]}, None, id="one token-id prompt in a list"),
    pytest.param("chat", {"n": "2", "temperature": "hot"}, 0.5,
                 id="wrongly typed values are the backend's to reject"),
    pytest.param("chat", {"response_format": nested(100)}, None, id="deep but sane nesting"),
]


@pytest.mark.parametrize(("kind", "change", "max_temperature"), CACHEABLE)
def test_requests_with_one_plain_answer_are_cacheable(
        kind: Kind, change: dict[str, Any], max_temperature: float | None) -> None:
    key({**base(kind), **change}, kind, max_temperature=max_temperature)


def test_a_body_that_is_not_json_is_the_callers_bug() -> None:
    with pytest.raises(TypeError, match="JSON values"):
        cache_key("chat", {**CHAT, "x": object()}, MODEL)
    with pytest.raises(TypeError, match="str object keys"):
        cache_key("chat", {**CHAT, "x": {1: "a"}}, MODEL)


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**CHAT, "messages": list(messages), **fields}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}

QUERY = [
    pytest.param(chat(SYSTEM, QUESTION), "What is the capital of France?",
                 id="the last user message"),
    pytest.param(chat(user([text_part("Capital"), text_part("of France?")])),
                 "Capital\nof France?", id="text parts joined by newlines"),
    pytest.param(chat(user([text_part("What is this?"), IMAGE])), None, id="an image part"),
    pytest.param(chat(QUESTION, {"role": "assistant", "content": "Paris."}), None,
                 id="assistant message last"),
    pytest.param(chat(QUESTION, {"role": "tool", "tool_call_id": "c1", "content": "18C"}), None,
                 id="tool result last"),
    pytest.param(chat(user("   \n")), None, id="blank text: nothing to embed"),
    pytest.param(chat(user([])), None, id="no parts"),
    pytest.param(chat(user(None)), None, id="null content"),
    pytest.param(chat(), None, id="no messages"),
    pytest.param(chat(user([{"type": "text"}])), None, id="a text part without text"),
]


@pytest.mark.parametrize(("body", "query"), QUERY)
def test_chat_queries_only_the_text_of_a_last_user_message(body: dict[str, Any],
                                                          query: str | None) -> None:
    assert key(body).query == query


TEXT_QUERY = [
    pytest.param("Once upon a time", "Once upon a time", id="a string prompt"),
    pytest.param(["Once upon a time"], "Once upon a time", id="a one-string list"),
    pytest.param([1, 2, 3], None, id="token ids"),
    pytest.param([[1, 2, 3]], None, id="one token-id prompt in a list"),
    pytest.param("", None, id="empty prompt"),
]


@pytest.mark.parametrize(("prompt", "query"), TEXT_QUERY)
def test_completions_query_a_text_prompt(prompt: Any, query: str | None) -> None:
    assert key({**TEXT, "prompt": prompt}, "text").query == query


def test_without_a_query_the_namespace_is_the_id() -> None:
    found = key(chat(user([IMAGE])))
    assert found.query is None and found.namespace == found.id


PARAPHRASE = user("what's the capital of france")

SAME_NAMESPACE = [
    pytest.param("chat", chat(SYSTEM, PARAPHRASE), id="a paraphrased last user message"),
    pytest.param("chat", chat(SYSTEM, {**QUESTION, "content": [text_part(QUESTION["content"])]}),
                 id="the same text as a parts list"),
    pytest.param("text", {**TEXT, "prompt": "Long ago"}, id="text: another prompt"),
    pytest.param("text", {**TEXT, "prompt": ["Long ago"]}, id="text: a one-string list"),
]


@pytest.mark.parametrize(("kind", "body"), SAME_NAMESPACE)
def test_a_new_query_keeps_the_namespace_but_not_the_id(kind: Kind, body: dict[str, Any]
                                                        ) -> None:
    original, other = key(base(kind), kind), key(body, kind)
    assert other.namespace == original.namespace
    assert other.id != original.id


EARLIER = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]

OTHER_NAMESPACE = [
    pytest.param(chat({"role": "system", "content": "You are verbose."}, QUESTION),
                 id="a different system prompt"),
    pytest.param(chat(SYSTEM, *EARLIER, QUESTION), id="an earlier turn"),
    pytest.param(chat(SYSTEM, {**EARLIER[0], "content": "Hey"}, EARLIER[1], QUESTION),
                 id="a different earlier turn"),
    pytest.param(chat(SYSTEM, {**QUESTION, "name": "bob"}), id="the last message's name"),
    pytest.param(chat(SYSTEM, QUESTION, max_tokens=8), id="max_tokens"),
    pytest.param(chat(SYSTEM, QUESTION, temperature=0.3), id="temperature"),
    pytest.param(chat(SYSTEM, QUESTION, tools=[TOOL]), id="tools"),
    pytest.param(chat(SYSTEM, QUESTION, x_vendor_knob=1), id="an unknown field"),
]


@pytest.mark.parametrize("body", OTHER_NAMESPACE)
def test_anything_but_the_query_changes_the_namespace(body: dict[str, Any]) -> None:
    assert key(body).namespace != key(CHAT).namespace


def test_another_model_is_another_namespace() -> None:
    assert key(CHAT, model="llama-3-70b").namespace != key(CHAT).namespace


def test_the_caller_body_is_left_untouched() -> None:
    body = chat(SYSTEM, QUESTION)
    before = repr(body)
    key(body)
    assert repr(body) == before
