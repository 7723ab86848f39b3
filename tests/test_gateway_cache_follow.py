"""An identical stream following one in flight keeps its stream when the leading stream's client
leaves: the upstream goes on while any follower reads it, the whole answer is stored, and when the
last follower leaves too, the backend aborts. A real gateway, a real simulator, on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from tests.waiting import until

MODEL = PRESETS[DEFAULT_PRESET].model_name
CHAT = "/v1/chat/completions"
TOKENS = 400  # long enough that the leader is still generating when its client leaves
BODY = {"model": MODEL, "stream": True, "temperature": 0, "max_tokens": TOKENS,
        "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me a long story."}]}


@asynccontextmanager
async def rig() -> AsyncIterator[tuple[str, str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(time_scale=2.0))
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": sim, "id": "sim0"}],
            "cache": {"enabled": True}})
        url = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, sim, http



async def first_text(resp: aiohttp.ClientResponse) -> None:
    """Reads `resp` until its first text token."""
    async for line in resp.content:
        if b'"content":"' in line.replace(b'"content":""', b""):
            return
    raise AssertionError("the stream ended without text")


def events(raw: bytes) -> list[Any]:
    frames = [f.strip().removeprefix(b"data: ") for f in raw.split(b"\n\n") if f.strip()]
    assert frames[-1] == b"[DONE]", frames[-3:]
    return [orjson.loads(f) for f in frames[:-1]]


async def counted(http: aiohttp.ClientSession, server: str, name: str, label: str,
                  value: str) -> float:
    """The sum of `server`'s Prometheus samples `name` whose `label` is `value`."""
    async with http.get(server + "/metrics") as resp:
        text = await resp.text()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name and sample.labels.get(label) == value)


async def aborted(http: aiohttp.ClientSession, sim: str) -> float:
    """Requests the simulator aborted (its client, the gateway, went away)."""
    return await counted(http, sim, "vllm:request_success_total", "finished_reason", "abort")


async def client_closed(http: aiohttp.ClientSession, url: str) -> float:
    """Completion requests the gateway recorded as ended by their client."""
    return await counted(http, url, "gen_ai_server_request_duration_seconds_count",
                         "error_type", "client_closed")


async def inflight(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/admin/backends") as resp:
        return int(orjson.loads(await resp.read())["backends"][0]["inflight"])


async def entries(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url + "/admin/cache") as resp:
        return int(orjson.loads(await resp.read())["entries"])


async def test_a_follower_keeps_its_stream_when_the_leaders_client_leaves() -> None:
    async with rig() as (url, sim, http):
        leader = await http.post(url + CHAT, json=BODY)
        assert leader.headers["x-kvgate-cache"] == "miss"
        await first_text(leader)
        async with http.post(url + CHAT, json=BODY) as follower:
            assert follower.headers["x-kvgate-cache"] == "exact"
            assert "x-kvgate-backend" not in follower.headers
            await first_text(follower)
            leader.close()  # the leading stream's own client leaves

            async def leader_recorded_gone() -> bool:
                return await client_closed(http, url) == 1

            await until(leader_recorded_gone, "the leader's request recorded as client_closed")
            # Its backend still generates the stream for the follower: the lease stays held.
            assert await inflight(http, url) == 1
            rest = await follower.read()
        found = events(rest)
        assert not any("error" in event for event in found)
        assert found[-1]["choices"][0]["finish_reason"] == "length"
        assert await aborted(http, sim) == 0

        async def stored() -> bool:
            return await entries(http, url) == 1

        await until(stored, "the whole answer stored")

        async def released() -> bool:
            return await inflight(http, url) == 0

        await until(released, "the lease released once the stream read on has ended")
        async with http.post(url + CHAT, json=BODY) as again:
            assert again.headers["x-kvgate-cache"] == "exact"


async def test_the_upstream_is_aborted_when_the_last_follower_leaves_too() -> None:
    async with rig() as (url, sim, http):
        leader = await http.post(url + CHAT, json=BODY)
        await first_text(leader)
        follower = await http.post(url + CHAT, json=BODY)
        assert follower.headers["x-kvgate-cache"] == "exact"
        await first_text(follower)
        leader.close()
        await asyncio.sleep(0)  # nothing to wait for: the follower leaves at once too
        follower.close()

        async def abort_seen() -> bool:
            return await aborted(http, sim) == 1

        await until(abort_seen, "the backend aborts once no one reads the stream")
        assert await entries(http, url) == 0
