"""The gateway learns each backend's speed from the answers it relays, whatever the client asked
for: from a stream it asks the backend for usage (`stream_options.include_usage`) and drops the
usage event when the client did not ask; a whole answer teaches by its duration. End to end
against real simulators on loopback; the learned speed is visible in /admin/backends
(`speed_scale`, `speed_replies`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim

MODEL = "llama-3-8b"


@asynccontextmanager
async def gateway_over(presets: dict[str, str], **server: Any
                       ) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        urls = {name: await stack.enter_async_context(
                    running_sim(preset=preset, model=MODEL, seed=i))
                for i, (name, preset) in enumerate(presets.items())}
        settings = Settings.model_validate({
            "server": {"port": 0, **server},
            "backends": [{"url": url, "id": name} for name, url in urls.items()],
            # Round robin: every backend serves the same share, whatever it is learned to be.
            "routing": {"poll_interval_s": 0.05, "policy": "round_robin"},
        })
        gateway = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield gateway, http


async def stream(http: aiohttp.ClientSession, gateway: str, tag: int) -> list[dict[str, Any]]:
    """One streamed chat whose client does not ask for usage; its events, [DONE] left out."""
    body = {"model": MODEL, "stream": True, "max_tokens": 24, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{tag} " + "word " * 200}]}
    async with http.post(gateway + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        raw = await resp.read()
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


async def speeds(http: aiohttp.ClientSession, gateway: str) -> dict[str, tuple[Any, Any]]:
    async with http.get(gateway + "/admin/backends") as resp:
        rows = orjson.loads(await resp.read())["backends"]
    return {row["id"]: (row["speed_scale"], row["speed_replies"]) for row in rows}


async def test_speed_is_learned_from_every_stream_and_the_client_gets_no_usage_it_did_not_ask_for(
) -> None:
    async with gateway_over({"b0": "llama-3-8b-h100"}) as (gateway, http):
        assert await speeds(http, gateway) == {"b0": (None, 0)}  # nothing measured: null
        for i in range(5):
            events = await stream(http, gateway, i)
            assert all("usage" not in e for e in events)
            assert events[-1]["choices"][0]["finish_reason"] == "length"
        scale, replies = (await speeds(http, gateway))["b0"]
        assert replies == 5
        assert scale is not None and scale > 0


async def test_with_stream_usage_off_streams_are_timed_over_their_text_events() -> None:
    async with gateway_over({"b0": "llama-3-8b-h100"}, stream_usage=False) as (gateway, http):
        for i in range(3):
            await stream(http, gateway, i)
        assert (await speeds(http, gateway))["b0"][1] == 3


async def test_answers_that_are_not_streamed_teach_the_speed_too() -> None:
    async with gateway_over({"b0": "llama-3-8b-h100"}) as (gateway, http):
        for i in range(3):
            body = {"model": MODEL, "max_tokens": 24, "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"{i} " + "word " * 200}]}
            async with http.post(gateway + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                assert (await resp.json())["usage"]["completion_tokens"] == 24
        assert (await speeds(http, gateway))["b0"][1] == 3


async def test_a_slower_card_is_learned_slower_from_its_streams() -> None:
    """An L40S decodes this model about three times slower than an H100 (routing/physics.py);
    both serve the same requests, four at a time."""
    async with gateway_over({"h100": "llama-3-8b-h100", "l40s": "llama-3-8b-l40s"}) as (
            gateway, http):
        for start in range(0, 16, 4):
            await asyncio.gather(*(stream(http, gateway, i) for i in range(start, start + 4)))
        learned = await speeds(http, gateway)
        (h100, h100_replies), (l40s, l40s_replies) = learned["h100"], learned["l40s"]
        assert h100_replies == l40s_replies == 8
        assert l40s > 2.0 * h100, learned
