"""The response cache, end to end: a real gateway in front of a real simulator on loopback, with
the in-memory store and with a real redis-server the test starts itself.

A request is looked up before admission; a hit is replayed in the shape the client asked for
(JSON or SSE, usage chunk only when asked) with `x-kvgate-cache: exact|semantic`, the model that
produced it and no `x-kvgate-backend`. A miss is stored once its answer ended whole. Answers are
stored off the request's path, so tests wait for the store with /admin/cache, polled with a
deadline.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.cache.http import cache_directives
from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from tests.redis_server import running_redis

MODEL = "llama-3-8b"
CHAT = "/v1/chat/completions"
DEADLINE_S = 10.0


@asynccontextmanager
async def gateway(cache: dict[str, Any] | None = None, *, sim_url: str | None = None
                  ) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        if sim_url is None:
            sim_url = await stack.enter_async_context(running_sim(model=MODEL, time_scale=20.0))
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": sim_url, "id": "sim0"}],
            "routing": {"poll_interval_s": 0.05},
            "cache": {"enabled": True, "semantic": "on", "embedder": "hashing", **(cache or {})},
        })
        url = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, http


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": question}], **extra}


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with http.post(url + CHAT, json=body, headers=headers or {}) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def stored(http: aiohttp.ClientSession, url: str, entries: int) -> dict[str, Any]:
    """/admin/cache once it holds `entries` entries (answers are stored in the background)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        async with http.get(url + "/admin/cache") as resp:
            state: dict[str, Any] = orjson.loads(await resp.read())
        if state["entries"] >= entries or loop.time() > deadline:
            return state
        await asyncio.sleep(0.02)


COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def counts(raw: bytes) -> dict[str, int]:
    usage = orjson.loads(raw)["usage"]
    return {name: usage[name] for name in COUNTS}


def content(raw: bytes) -> str:
    return str(orjson.loads(raw)["choices"][0]["message"]["content"])


def events(raw: bytes) -> list[Any]:
    frames = [f.removeprefix(b"data: ") for f in raw.split(b"\n\n") if f.strip()]
    assert frames[-1] == b"[DONE]"
    return [orjson.loads(f) for f in frames[:-1]]


def streamed_text(raw: bytes) -> str:
    return "".join(choice["delta"].get("content") or ""
                   for event in events(raw) for choice in event["choices"])


async def test_a_repeated_request_is_answered_from_the_cache_without_a_backend() -> None:
    async with gateway() as (url, http):
        status, headers, first = await post(http, url, chat("What is the capital of France?"))
        assert status == 200
        assert headers["x-kvgate-cache"] == "miss"
        assert headers["x-kvgate-backend"] == "sim0"
        assert (await stored(http, url, 1))["entries"] == 1

        status, headers, again = await post(http, url, chat("What is the capital of France?"))
        assert status == 200
        assert headers["x-kvgate-cache"] == "exact"
        assert "x-kvgate-backend" not in headers
        assert headers["x-kvgate-model"] == MODEL
        assert headers["x-kvgate-cache-similarity"] == "1.000"
        assert 0 <= int(headers["Age"]) <= DEADLINE_S
        assert content(again) == content(first)
        assert counts(again) == counts(first)
        state = await stored(http, url, 1)
        assert state["counters"]["exact"] == 1
        assert state["counters"]["miss"] == 1


async def test_a_near_duplicate_question_is_a_semantic_hit_and_another_question_is_not() -> None:
    async with gateway() as (url, http):
        _, _, first = await post(http, url, chat("What is the capital of France?"))
        await stored(http, url, 1)
        _, headers, near = await post(http, url, chat("what's the capital of france"))
        assert headers["x-kvgate-cache"] == "semantic"
        assert 0.9 <= float(headers["x-kvgate-cache-similarity"]) <= 1.0
        assert content(near) == content(first)
        _, headers, _ = await post(http, url, chat("What is the capital of Spain?"))
        assert headers["x-kvgate-cache"] == "miss"


async def test_the_same_question_after_another_system_prompt_is_a_miss() -> None:
    async with gateway() as (url, http):
        await post(http, url, chat("What is the capital of France?"))
        await stored(http, url, 1)
        other = chat("What is the capital of France?")
        other["messages"][0]["content"] = "You answer in French."
        _, headers, _ = await post(http, url, other)
        assert headers["x-kvgate-cache"] == "miss"


async def test_a_stream_is_stored_and_replayed_as_a_stream_or_as_json() -> None:
    async with gateway() as (url, http):
        _, headers, raw = await post(http, url, chat("Tell me a story.", stream=True))
        assert headers["x-kvgate-cache"] == "miss"
        text = streamed_text(raw)
        assert text
        await stored(http, url, 1)

        _, headers, replayed = await post(http, url, chat("Tell me a story.", stream=True))
        assert headers["x-kvgate-cache"] == "exact"
        assert headers["Content-Type"].startswith("text/event-stream")
        assert streamed_text(replayed) == text
        assert all("usage" not in event or event["usage"] is None for event in events(replayed))
        assert events(replayed)[-1]["choices"][0]["finish_reason"] in ("stop", "length")

        _, headers, whole = await post(http, url, chat("Tell me a story."))
        assert headers["x-kvgate-cache"] == "exact"
        assert content(whole) == text


async def test_a_replayed_stream_carries_usage_only_when_the_client_asks() -> None:
    async with gateway() as (url, http):
        _, _, first = await post(http, url, chat("Count to five."))
        await stored(http, url, 1)
        body = chat("Count to five.", stream=True, stream_options={"include_usage": True})
        _, headers, raw = await post(http, url, body)
        assert headers["x-kvgate-cache"] == "exact"
        last = events(raw)[-1]
        assert last["choices"] == []
        assert {k: last["usage"][k] for k in COUNTS} == counts(first)


@pytest.mark.parametrize(
    ("control", "second"),
    [
        pytest.param("no-store", "miss", id="no-store: the answer is not kept"),
        pytest.param("no-cache", "exact", id="no-cache: looked past, but the answer is kept"),
    ],
)
async def test_cache_control_steers_the_cache_per_request(control: str, second: str) -> None:
    async with gateway() as (url, http):
        _, headers, _ = await post(http, url, chat("Hello there"), {"Cache-Control": control})
        assert headers["x-kvgate-cache"] == ("bypass" if control == "no-cache" else "miss")
        assert headers["x-kvgate-backend"] == "sim0"
        if second == "exact":
            await stored(http, url, 1)
        _, headers, _ = await post(http, url, chat("Hello there"))
        assert headers["x-kvgate-cache"] == second


async def test_a_request_for_several_choices_bypasses_the_cache() -> None:
    async with gateway() as (url, http):
        _, headers, _ = await post(http, url, chat("Hi", n=2))
        assert headers["x-kvgate-cache"] == "bypass"
        assert (await stored(http, url, 0))["entries"] == 0


async def test_hits_are_counted_in_the_metrics_with_a_ttft_and_no_tpot() -> None:
    async with gateway() as (url, http):
        await post(http, url, chat("What is the capital of France?"))
        await stored(http, url, 1)
        await post(http, url, chat("What is the capital of France?", stream=True))
        await post(http, url, chat("what's the capital of france"))
        async with http.get(url + "/metrics") as resp:
            text = (await resp.read()).decode()
        lookups = [line for line in text.splitlines() if line.startswith("kvgate_cache_lookups")]
        assert any('kvgate_cache_tier="exact"' in line and 'lookup="hit"' in line
                   and line.endswith(" 1") for line in lookups), lookups
        assert any('kvgate_cache_tier="semantic"' in line and 'lookup="hit"' in line
                   and line.endswith(" 1") for line in lookups), lookups
        hit = 'kvgate_cache_result="exact"'
        assert any(line.startswith("gen_ai_server_time_to_first_token_seconds_count")
                   and hit in line for line in text.splitlines())
        # A replayed answer's pace is the gateway's, not a GPU's: it is no TPOT.
        assert not any(line.startswith("gen_ai_server_time_per_output_token") and hit in line
                       for line in text.splitlines())


async def test_gateways_sharing_one_redis_share_its_answers() -> None:
    async with running_redis() as redis_url, running_sim(model=MODEL, time_scale=20.0) as sim:
        cache = {"store": "redis", "redis_url": redis_url}
        async with gateway(cache, sim_url=sim) as (first_url, http):
            _, headers, first = await post(http, first_url, chat("Where is Lisbon?"))
            assert headers["x-kvgate-cache"] == "miss"
            await stored(http, first_url, 1)
        async with gateway(cache, sim_url=sim) as (second_url, http):
            _, headers, again = await post(http, second_url, chat("Where is Lisbon?"))
            assert headers["x-kvgate-cache"] == "exact"
            assert content(again) == content(first)


async def test_an_unreachable_redis_costs_no_request_its_answer() -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = {"store": "redis", "redis_url": f"redis://127.0.0.1:{port}/0"}
    async with gateway(cache) as (url, http):
        for _ in range(3):
            status, headers, raw = await post(http, url, chat("Still there?"))
            assert status == 200
            assert headers["x-kvgate-cache"] in ("miss", "bypass")
            assert content(raw)
        async with http.get(url + "/admin/cache") as resp:
            assert resp.status == 503


async def in_flight(http: aiohttp.ClientSession, url: str) -> None:
    """Returns once the backend has a request of the gateway's in flight."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        async with http.get(url + "/admin/backends") as resp:
            if orjson.loads(await resp.read())["backends"][0]["inflight"] >= 1:
                return
        assert asyncio.get_running_loop().time() < deadline, "nothing reached the backend"
        await asyncio.sleep(0.005)


async def test_identical_whole_requests_in_flight_ask_the_backend_once() -> None:
    async with running_sim(model=MODEL, time_scale=1.0) as sim, \
            gateway(sim_url=sim) as (url, http):
        body = chat("Summarise the history of Rome.", max_tokens=64)
        first = asyncio.create_task(post(http, url, body))
        await in_flight(http, url)  # the first is at the backend before the others arrive
        followers = await asyncio.gather(*(post(http, url, body) for _ in range(4)))
        status, headers, leader = await first
        assert (status, headers["x-kvgate-cache"], headers["x-kvgate-backend"]) == (
            200, "miss", "sim0")
        for status, headers, raw in followers:
            assert (status, headers["x-kvgate-cache"]) == (200, "exact")
            assert "x-kvgate-backend" not in headers
            assert content(raw) == content(leader)


async def test_a_stream_does_not_wait_for_an_identical_request_in_flight() -> None:
    async with running_sim(model=MODEL, time_scale=1.0) as sim, \
            gateway(sim_url=sim) as (url, http):
        first = asyncio.create_task(post(http, url, chat("Tell me about Rome.", max_tokens=64)))
        await in_flight(http, url)
        _, headers, _ = await post(http, url, chat("Tell me about Rome.", max_tokens=64,
                                                   stream=True))
        assert (headers["x-kvgate-cache"], headers["x-kvgate-backend"]) == ("miss", "sim0")
        await first


@pytest.mark.parametrize(
    ("header", "directives"),
    [
        pytest.param("no-cache", {"no-cache": None}, id="a bare directive"),
        pytest.param("No-Store, MAX-AGE=60", {"no-store": None, "max-age": "60"},
                     id="names lower-cased, values kept"),
        pytest.param('max-age="30", ,', {"max-age": "30"}, id="quotes and empty parts"),
    ],
)
def test_cache_control_directives_are_read(header: str, directives: dict[str, str | None]
                                           ) -> None:
    assert cache_directives(header) == directives


async def test_max_age_takes_only_an_answer_young_enough() -> None:
    async with gateway() as (url, http):
        await post(http, url, chat("How old is Rome?"))
        await stored(http, url, 1)
        _, headers, _ = await post(http, url, chat("How old is Rome?"),
                                   {"Cache-Control": "max-age=3600"})
        assert headers["x-kvgate-cache"] == "exact"
        _, headers, _ = await post(http, url, chat("How old is Rome?"),
                                   {"Cache-Control": "max-age=0"})
        assert (headers["x-kvgate-cache"], headers["x-kvgate-backend"]) == ("miss", "sim0")


async def test_an_admin_can_flush_the_cache() -> None:
    async with gateway() as (url, http):
        await post(http, url, chat("What is the capital of France?"))
        await stored(http, url, 1)
        async with http.delete(url + "/admin/cache") as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read()) == {"enabled": True, "removed": 1}
        assert (await stored(http, url, 0))["entries"] == 0
        _, headers, _ = await post(http, url, chat("What is the capital of France?"))
        assert headers["x-kvgate-cache"] == "miss"


async def test_an_identical_stream_follows_one_in_flight_as_its_text_comes() -> None:
    async with running_sim(model=MODEL, time_scale=1.0) as sim, \
            gateway(sim_url=sim) as (url, http):
        body = chat("Tell me about Lisbon.", max_tokens=64, stream=True)
        first = asyncio.create_task(post(http, url, body))
        await in_flight(http, url)
        followers = await asyncio.gather(
            post(http, url, body),
            post(http, url, {**body, "stream_options": {"include_usage": True}}))
        _, headers, leader = await first
        assert (headers["x-kvgate-cache"], headers["x-kvgate-backend"]) == ("miss", "sim0")
        for _, headers, raw in followers:
            assert headers["x-kvgate-cache"] == "exact"
            assert "x-kvgate-backend" not in headers
            assert streamed_text(raw) == streamed_text(leader)
        plain, with_usage = (events(raw) for _, _, raw in followers)
        assert all(not e.get("usage") for e in plain)
        assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"]
