"""What small-model routing reads of a request, as tables: the rules' facts (tools, a
response_format other than text, the pin header), the question the classifier reads (the last
user message), which classifier an alias gets, and a classifier fault sending the request to the
large model instead of failing it."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from gateway.config import CacheSettings
from gateway.exchange import Asked
from gateway.small_model import (
    SMALL_MODEL,
    UNSCORED,
    Classifier,
    Classifiers,
    ClassifierUnavailable,
    ask_of,
    cache_uses_local,
    choose,
    kind_of,
    question_of,
)
from routing.difficulty.calibrate import Thresholds
from routing.difficulty.weights import shipped
from routing.model_select import Selection, SmallModelRoute

ROUTE = SmallModelRoute(alias="auto", large="big", small="tiny")


def asked(data: dict[str, Any], text: str = "hi") -> Asked:
    return Asked(raw=b"", data=data, model="auto", stream=False, include_usage=False,
                 output_cap=None, choices=1, prompt_text=text, conversation=text,
                 prompt_tokens=None, user_turns=1, tenant="t")


@pytest.mark.parametrize(
    ("data", "headers", "facts"),
    [
        pytest.param({}, {}, (False, False, False), id="a plain request: nothing certain"),
        pytest.param({"tools": [{"type": "function"}]}, {}, (True, False, False), id="tools"),
        pytest.param({"functions": [{"name": "f"}]}, {}, (True, False, False),
                     id="the legacy functions count as tools"),
        pytest.param({"response_format": {"type": "json_object"}}, {}, (False, True, False),
                     id="a JSON response_format"),
        pytest.param({"response_format": {"type": "text"}}, {}, (False, False, False),
                     id="a text response_format is no constraint"),
        pytest.param({}, {"x-kvgate-model-route": " Large "}, (False, False, True),
                     id="the pin header, any case and spacing"),
        pytest.param({}, {"x-kvgate-model-route": "small"}, (False, False, False),
                     id="only large can be pinned"),
    ],
)
def test_the_facts_the_rules_read(data: dict[str, Any], headers: dict[str, str],
                                  facts: tuple[bool, bool, bool]) -> None:
    ask = ask_of(asked(data), headers)
    assert (ask.tools, ask.response_format, ask.pinned_large) == facts


@pytest.mark.parametrize(
    ("data", "question"),
    [
        pytest.param({"messages": [{"role": "system", "content": "Be terse."},
                                   {"role": "user", "content": "first"},
                                   {"role": "assistant", "content": "ok"},
                                   {"role": "user", "content": "what is 3^47 mod 11"}]},
                     "what is 3^47 mod 11", id="a chat: its last user message"),
        pytest.param({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {}},
            {"type": "text", "text": "this"}]}]}, "describe\nthis",
            id="content parts: their text"),
        pytest.param({"prompt": "complete me"}, "the whole prompt",
                     id="a completion: the whole prompt"),
    ],
)
def test_the_classifier_reads_the_question(data: dict[str, Any], question: str) -> None:
    assert question_of(data, "the whole prompt") == question


@pytest.mark.parametrize(
    ("setting", "installed", "cache_local", "kind"),
    [
        pytest.param("auto", True, True, "minilm",
                     id="auto while the cache runs the local model: minilm, on its embedding"),
        pytest.param("auto", True, False, "hashed",
                     id="auto with the extra but no cache embedding: hashed"),
        pytest.param("auto", False, False, "hashed", id="auto without the extra: hashed"),
        pytest.param("hashed", True, True, "hashed", id="hashed asked for: hashed"),
        pytest.param("minilm", True, False, "minilm", id="minilm asked for: minilm"),
    ],
)
def test_the_classifier_an_alias_gets(setting: str, installed: bool, cache_local: bool,
                                      kind: str) -> None:
    assert kind_of(setting, installed, cache_local) == kind


@pytest.mark.parametrize(
    ("cache", "installed", "local"),
    [
        pytest.param(CacheSettings(enabled=True, semantic="on"), True, True,
                     id="semantic on, embedder auto, the extra installed"),
        pytest.param(CacheSettings(enabled=True, semantic="shadow", embedder="local"), True,
                     True, id="shadow with the local model"),
        pytest.param(CacheSettings(enabled=True), True, False, id="semantic off"),
        pytest.param(CacheSettings(enabled=False, semantic="on"), True, False,
                     id="the cache off"),
        pytest.param(CacheSettings(enabled=True, semantic="on", embedder="hashing"), True,
                     False, id="the hashing embedder"),
        pytest.param(CacheSettings(enabled=True, semantic="on"), False, False,
                     id="auto without the extra: hashing"),
    ],
)
def test_whether_the_cache_runs_the_local_model(cache: CacheSettings, installed: bool,
                                                local: bool) -> None:
    assert cache_uses_local(cache, installed) is local


def test_minilm_without_the_extra_is_a_configuration_error() -> None:
    with pytest.raises(ClassifierUnavailable, match="kvgate\\[semantic\\]"):
        kind_of("minilm", False)


async def test_a_classifier_fault_sends_the_request_large() -> None:
    app = web.Application()
    broken = Classifier(shipped("minilm"), Thresholds(0.5, 0.0, 0.5))
    app[SMALL_MODEL] = Classifiers({"auto": broken}, embedder=None)  # no embedder: it raises
    assert await choose(app, ROUTE, asked({}), {}) == Selection("big", False, UNSCORED)
