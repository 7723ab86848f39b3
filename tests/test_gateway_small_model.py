"""Small-model routing end to end: a large and a small simulator on loopback behind the gateway.
A request for the routing alias goes to the small model when its classifier finds it easy (or,
in mode overflow, only while the large model is busy; in mode shadow never); the response names
the model that served it and why: the rule, or the verdict with its score and threshold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, SMALL_PRESET

LARGE = PRESETS[DEFAULT_PRESET].model_name
SMALL = PRESETS[SMALL_PRESET].model_name


@asynccontextmanager
async def gateway(mode: str = "easy", *, with_small: bool = True,
                  route: dict[str, Any] | None = None,
                  cache: bool | dict[str, Any] = False,
                  time_scale: float = 20.0, routing: dict[str, Any] | None = None,
                  slo: dict[str, Any] | None = None,
                  large_blocks: int | None = None
                  ) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        backends = [{"id": "large", "url": await stack.enter_async_context(
            running_sim(preset=DEFAULT_PRESET, time_scale=time_scale,
                        num_gpu_blocks=large_blocks))}]
        if with_small:
            backends.append({"id": "small", "url": await stack.enter_async_context(
                running_sim(preset=SMALL_PRESET, time_scale=20.0, seed=1))})
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": backends,
            "routing": {"poll_interval_s": 0.05, **(routing or {})}, "slo": slo or {},
            "small_model": [{"alias": "auto", "large": LARGE, "small": SMALL, "mode": mode,
                             "classifier": "hashed", **(route or {})}],
            "cache": {"enabled": bool(cache), **(cache if isinstance(cache, dict) else {})},
        })
        url = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, http


async def ask(http: aiohttp.ClientSession, url: str, content: str, *,
              headers: dict[str, str] | None = None, **extra: Any) -> dict[str, str]:
    body = {"model": "auto", "max_tokens": 16,
            "messages": [{"role": "user", "content": content}], **extra}
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        payload = orjson.loads(await resp.read())
        assert payload["model"] == resp.headers["x-kvgate-model"]
        return dict(resp.headers)


def reason_of(headers: dict[str, str]) -> str:
    """The rule or verdict of `x-kvgate-model-reason`, without its score and threshold."""
    return headers["x-kvgate-model-reason"].split(";")[0]


@pytest.mark.parametrize(
    ("content", "extra", "model", "expected", "backend"),
    [
        pytest.param("What is the capital of France?", {}, SMALL, "easy", "small",
                     id="an easy question goes to the small model"),
        pytest.param("What is the capital of France?", {"max_tokens": None}, SMALL, "easy",
                     "small", id="without max_tokens too: the text decides"),
        pytest.param("what is 3^47 mod 11", {}, LARGE, "hard", "large",
                     id="a short hard one without a marker goes large by its score"),
        pytest.param("Prove that there are infinitely many primes.", {}, LARGE, "hard_marker",
                     "large", id="a marked one to the large model"),
        pytest.param("What is the capital of France?",
                     {"tools": [{"type": "function", "function": {"name": "f"}}]}, LARGE,
                     "tools", "large", id="tools send it large"),
        pytest.param("What is the capital of France?", {"max_tokens": 2000}, LARGE,
                     "long_output", "large", id="a long answer asked for to the large model"),
        pytest.param("word " * 2000, {}, LARGE, "long_prompt", "large",
                     id="a long prompt to the large model"),
    ],
)
async def test_the_alias_chooses_the_model(content: str, extra: dict[str, Any], model: str,
                                           expected: str, backend: str) -> None:
    async with gateway() as (url, http):
        headers = await ask(http, url, content, **extra)
        assert headers["x-kvgate-model"] == model
        assert reason_of(headers) == expected
        assert headers["x-kvgate-backend"] == backend


async def test_a_named_model_is_served_as_named() -> None:
    async with gateway() as (url, http):
        body = {"model": LARGE, "max_tokens": 8,
                "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["x-kvgate-model"] == LARGE
            assert "x-kvgate-model-reason" not in resp.headers


async def test_overflow_keeps_an_idle_large_model_serving_easy_requests() -> None:
    async with gateway("overflow") as (url, http):
        headers = await ask(http, url, "What is the capital of France?")
        assert (headers["x-kvgate-model"], reason_of(headers)) == (
            LARGE, "large_free")


async def test_without_a_small_backend_easy_requests_stay_on_the_large_model() -> None:
    async with gateway(with_small=False) as (url, http):
        headers = await ask(http, url, "What is the capital of France?")
        assert (headers["x-kvgate-model"], reason_of(headers)) == (
            LARGE, "small_unavailable")


async def test_the_alias_is_listed_and_decisions_are_counted() -> None:
    async with gateway() as (url, http):
        async with http.get(url + "/v1/models") as resp:
            listed = {m["id"] for m in orjson.loads(await resp.read())["data"]}
        assert {"auto", LARGE, SMALL} <= listed
        await ask(http, url, "What is the capital of France?")
        await ask(http, url, "Prove it.")
        async with http.get(url + "/metrics") as resp:
            text = (await resp.read()).decode()
        decisions = {line.split("{")[1].split("}")[0]: line.rsplit(" ", 1)[1]
                     for line in text.splitlines()
                     if line.startswith("kvgate_small_model_decisions")}
        assert decisions == {'kvgate_small_model_chosen="true"': "1",
                             'kvgate_small_model_chosen="false"': "1"}
        # Only the request no rule decided was scored: one easy verdict, for alias auto.
        scores = [line for line in text.splitlines()
                  if line.startswith("kvgate_small_model_score_count")]
        assert scores == ['kvgate_small_model_score_count{gen_ai_request_model="auto",'
                          'kvgate_small_model_verdict="easy"} 1']


async def test_the_pin_header_sends_one_request_to_the_large_model() -> None:
    async with gateway() as (url, http):
        pinned = await ask(http, url, "What is the capital of France?",
                           headers={"x-kvgate-model-route": "large"})
        assert (pinned["x-kvgate-model"], pinned["x-kvgate-model-reason"]) == (LARGE, "pinned")
        unpinned = await ask(http, url, "What is the capital of France?")
        assert unpinned["x-kvgate-model"] == SMALL


@pytest.mark.parametrize(
    ("content", "verdict"),
    [
        pytest.param("What is the capital of France?", "shadow:easy",
                     id="shadow: an easy verdict is reported, the large model serves"),
        pytest.param("what is 3^47 mod 11", "shadow:hard", id="shadow: and a hard one"),
    ],
)
async def test_shadow_mode_reports_the_decision_without_acting(content: str,
                                                               verdict: str) -> None:
    async with gateway("shadow") as (url, http):
        headers = await ask(http, url, content)
        assert (headers["x-kvgate-model"], reason_of(headers)) == (LARGE, verdict)
        assert "score=" in headers["x-kvgate-model-reason"]


async def test_the_reason_names_the_score_and_the_threshold_in_force() -> None:
    async with gateway(route={"threshold": 0.25}) as (url, http):
        headers = await ask(http, url, "What is the capital of France?")
        verdict, score, threshold = headers["x-kvgate-model-reason"].split("; ")
        assert (verdict, threshold) == ("easy", "threshold=0.250")
        assert 0.0 <= float(score.removeprefix("score=")) < 0.25


async def wait_for_entries(http: aiohttp.ClientSession, url: str, entries: int) -> None:
    """Answers are stored off the request's path: /admin/cache, polled with a deadline."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while True:
        async with http.get(url + "/admin/cache") as resp:
            if orjson.loads(await resp.read())["entries"] >= entries:
                return
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)


async def test_the_cache_is_keyed_by_the_chosen_model_so_it_serves_who_is_sent_there() -> None:
    async with gateway(cache=True) as (url, http):
        first = await ask(http, url, "What is the capital of France?", temperature=0)
        assert (first["x-kvgate-cache"], first["x-kvgate-model"]) == ("miss", SMALL)
        await wait_for_entries(http, url, 1)
        again = await ask(http, url, "What is the capital of France?", temperature=0)
        assert (again["x-kvgate-cache"], again["x-kvgate-model"], reason_of(again)) == (
            "exact", SMALL, "easy")
        for named, cache in ((SMALL, "exact"), (LARGE, "miss")):
            body = {"model": named, "max_tokens": 16, "temperature": 0,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]}
            async with http.post(url + "/v1/chat/completions", json=body) as resp:
                # The small model's answer serves whoever is sent to the small model, only.
                assert (resp.headers["x-kvgate-cache"], resp.headers["x-kvgate-model"]) == (
                    cache, named)


async def test_an_alias_never_serves_a_hard_request_the_small_models_semantic_answer() -> None:
    semantic = {"semantic": "on", "embedder": "hashing", "similarity_threshold": 0.5}
    async with gateway(cache=semantic) as (url, http):
        easy = await ask(http, url, "What is the capital of France?", temperature=0)
        assert (easy["x-kvgate-cache"], easy["x-kvgate-model"]) == ("miss", SMALL)
        await wait_for_entries(http, url, 1)
        near = await ask(http, url, "what is the capital of france", temperature=0)
        assert (near["x-kvgate-cache"], near["x-kvgate-model"]) == ("semantic", SMALL)
        # Near enough in wording, but hard: the large model is chosen, and answers it itself.
        hard = await ask(http, url, "What is the capital of France? Prove it.", temperature=0)
        assert (hard["x-kvgate-cache"], hard["x-kvgate-model"], reason_of(hard)) == (
            "miss", LARGE, "hard_marker")


async def test_overflow_sends_an_easy_request_the_large_model_refuses_to_the_small_one() -> None:
    # The large backend's KV holds 42 blocks; the first request will hold 36 at its peak, so
    # nothing more fits under the 0.9 high-water mark, and with no gateway queue the large
    # model refuses (429 queue_full) while its KV, as scraped, is still mostly free.
    routing = {"queue": {"max_depth": 0}}
    async with gateway("overflow", time_scale=1.0, routing=routing, slo={"admission": False},
                       large_blocks=42) as (
            url, http):
        long = {"model": LARGE, "stream": True, "max_tokens": 560, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Write a long story."}]}
        async with http.post(url + "/v1/chat/completions", json=long) as first:
            async for line in first.content:  # its first token: the large model's speed is read
                if b'"content":"' in line.replace(b'"content":""', b""):
                    break
            easy = {"model": LARGE, "max_tokens": 16,
                    "messages": [{"role": "user", "content": "What is 2 and 2?"}]}
            async with http.post(url + "/v1/chat/completions", json=easy) as refused:
                assert refused.status == 429  # the large model, named: refused
            headers = await ask(http, url, "What is the capital of France?")
            assert (headers["x-kvgate-model"], reason_of(headers)) == (
                SMALL, "overflow")
            first.close()
