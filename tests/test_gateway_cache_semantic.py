"""The semantic tier and sampling, end to end: a real gateway in front of a real simulator, with
the in-memory store and with a real redis-server.

- A request sampled hotter than `cache.max_temperature` (0 by default; an absent temperature is
  OpenAI's 1.0) is neither served from the cache nor stored, unless it sets a `seed`.
- `cache.semantic: shadow` serves no semantic hit: the near question goes to a backend, and the
  would-be hit is recorded with whether the two answers agreed, which `kvgate cache
  shadow-report` counts per similarity band.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.cli import main
from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from tests.redis_server import running_redis

MODEL = "llama-3-8b"
CHAT = "/v1/chat/completions"
DEADLINE_S = 10.0
QUESTION = "What is the capital of France?"
NEAR = "what's the capital of france"


@asynccontextmanager
async def gateway(cache: dict[str, Any]) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(model=MODEL, time_scale=20.0))
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": sim, "id": "sim0"}],
            "routing": {"poll_interval_s": 0.05}, "cache": {"enabled": True, **cache}})
        url = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, http


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 12,
            "messages": [{"role": "user", "content": question}], **extra}


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, str]:
    async with http.post(url + CHAT, json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
        return dict(resp.headers)


async def admin(http: aiohttp.ClientSession, url: str, path: str = "") -> dict[str, Any]:
    async with http.get(url + "/admin/cache" + path) as resp:
        found: dict[str, Any] = orjson.loads(await resp.read())
        return found


async def until(http: aiohttp.ClientSession, url: str, path: str, field: str,
                count: int) -> dict[str, Any]:
    """/admin/cache{path} once its `field` reaches `count` (stores run in the background)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        state = await admin(http, url, path)
        value = state[field]
        if (len(value) if isinstance(value, list) else value) >= count:
            return state
        assert loop.time() < deadline, f"{path or '/'} {field} stayed under {count}: {state}"
        await asyncio.sleep(0.02)


SAMPLING = [
    pytest.param({"temperature": 1}, "bypass", id="temperature 1: not served, not stored"),
    pytest.param({}, "bypass", id="no temperature is OpenAI's 1.0: not served"),
    pytest.param({"temperature": 1, "seed": 7}, "exact", id="temperature 1 with a seed: served"),
    pytest.param({"temperature": 0}, "exact", id="temperature 0: served"),
]


@pytest.mark.parametrize(("sampling", "second"), SAMPLING)
async def test_a_request_sampled_hot_is_not_served_from_the_cache_unless_seeded(
        sampling: dict[str, Any], second: str) -> None:
    async with gateway({}) as (url, http):
        first = await post(http, url, chat(QUESTION, **sampling))
        assert first["x-kvgate-cache"] == ("bypass" if second == "bypass" else "miss")
        if second == "exact":
            await until(http, url, "", "entries", 1)
        again = await post(http, url, chat(QUESTION, **sampling))
        assert again["x-kvgate-cache"] == second
        if second == "bypass":
            assert again["x-kvgate-backend"] == "sim0"
            assert (await admin(http, url))["entries"] == 0


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_shadow_mode_serves_nothing_and_its_report_counts_the_would_be_hits(
        store: str, capsys: pytest.CaptureFixture[str]) -> None:
    async with AsyncExitStack() as stack:
        cache: dict[str, Any] = {"semantic": "shadow", "embedder": "hashing"}
        if store == "redis":
            redis_url = await stack.enter_async_context(running_redis())
            cache |= {"store": "redis", "redis_url": redis_url}
        url, http = await stack.enter_async_context(gateway(cache))
        assert (await post(http, url, chat(QUESTION, temperature=0)))["x-kvgate-cache"] == "miss"
        await until(http, url, "", "entries", 1)
        near = await post(http, url, chat(NEAR, temperature=0))
        # Shadow mode served nothing: the near question went to the backend.
        assert (near["x-kvgate-cache"], near["x-kvgate-backend"]) == ("miss", "sim0")
        state = await until(http, url, "/shadow", "records", 1)
        (record,) = state["records"]
        assert record["similarity"] >= 0.9
        assert record["agreed"] in (True, False)  # the second answer was computed
        assert record["answer"] and record["cached_answer"]
        counters = (await admin(http, url))["counters"]
        assert (counters["semantic"], counters["miss"]) == (0, 2)

        where = ["--redis", redis_url] if store == "redis" else ["--gateway", url]
        # The record reaches Redis by a write of its own after the gateway holds it: poll.
        deadline = asyncio.get_running_loop().time() + 10.0
        while True:
            capsys.readouterr()
            code = await asyncio.to_thread(main, ["cache", "shadow-report", *where, "--json"])
            bands = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
            known = sum(band["known"] for band in bands)
            if code != 0 or known >= 1 or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert code == 0
        assert sum(band["would_hit"] for band in bands) == 1
        assert known == 1
