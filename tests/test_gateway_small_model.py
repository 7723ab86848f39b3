"""Small-model routing end to end: a large and a small simulator on loopback behind the gateway.
A request for the routing alias goes to the small model when it is easy (or, in mode overflow,
only while the large model is busy); the response names the model that served it and why."""

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
            "small_model": [{"alias": "auto", "large": LARGE, "small": SMALL, "mode": mode}],
            "cache": {"enabled": bool(cache), **(cache if isinstance(cache, dict) else {})},
        })
        url = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, http


async def ask(http: aiohttp.ClientSession, url: str, content: str, **extra: Any
              ) -> dict[str, str]:
    body = {"model": "auto", "max_tokens": 16,
            "messages": [{"role": "user", "content": content}], **extra}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        payload = orjson.loads(await resp.read())
        assert payload["model"] == resp.headers["x-kvgate-model"]
        return dict(resp.headers)


@pytest.mark.parametrize(
    ("content", "extra", "model", "reason", "backend"),
    [
        pytest.param("What is the capital of France?", {}, SMALL, "easy", "small",
                     id="an easy question goes to the small model"),
        pytest.param("Prove that there are infinitely many primes.", {}, LARGE, "hard_marker",
                     "large", id="a hard one to the large model"),
        pytest.param("What is the capital of France?", {"max_tokens": 2000}, LARGE,
                     "long_output", "large", id="a long answer asked for to the large model"),
        pytest.param("word " * 2000, {}, LARGE, "long_prompt", "large",
                     id="a long prompt to the large model"),
    ],
)
async def test_the_alias_chooses_the_model(content: str, extra: dict[str, Any], model: str,
                                           reason: str, backend: str) -> None:
    async with gateway() as (url, http):
        headers = await ask(http, url, content, **extra)
        assert headers["x-kvgate-model"] == model
        assert headers["x-kvgate-model-reason"] == reason
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
        assert (headers["x-kvgate-model"], headers["x-kvgate-model-reason"]) == (
            LARGE, "large_free")


async def test_without_a_small_backend_easy_requests_stay_on_the_large_model() -> None:
    async with gateway(with_small=False) as (url, http):
        headers = await ask(http, url, "What is the capital of France?")
        assert (headers["x-kvgate-model"], headers["x-kvgate-model-reason"]) == (
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
        assert (again["x-kvgate-cache"], again["x-kvgate-model"],
                again["x-kvgate-model-reason"]) == ("exact", SMALL, "easy")
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
        assert (hard["x-kvgate-cache"], hard["x-kvgate-model"],
                hard["x-kvgate-model-reason"]) == ("miss", LARGE, "hard_marker")


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
            assert (headers["x-kvgate-model"], headers["x-kvgate-model-reason"]) == (
                SMALL, "overflow")
            first.close()
