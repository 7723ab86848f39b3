"""The KV reservation over HTTP, against two real simulators on loopback: a stream sent with
`ignore_eos` reserves exactly its `max_tokens`, whatever short replies the gateway has learned
from, so eight long streams that would overfill two 400-block backends are held back in the
gateway's queue instead of being sent on to be preempted, and every one of them comes back
whole."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
LONG = 1500  # tokens: 95 of a simulator's 16-token blocks; three fit under its 360-block mark


async def stream(http: aiohttp.ClientSession, gateway: str, content: str,
                 **body: Any) -> tuple[int, str | None, int | None]:
    """(content chunks, the last finish_reason, usage.completion_tokens) of one chat stream."""
    payload = {"model": MODEL, "messages": [{"role": "user", "content": content}],
               "stream": True, "stream_options": {"include_usage": True}, **body}
    chunks, reason, tokens = 0, None, None
    async with http.post(gateway + "/v1/chat/completions", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = orjson.loads(line[6:])
            for choice in event.get("choices") or ():
                if choice.get("delta", {}).get("content"):
                    chunks += 1
                reason = choice.get("finish_reason") or reason
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return chunks, reason, tokens


async def counter(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


async def test_eight_long_ignore_eos_streams_after_short_replies_are_never_preempted() -> None:
    async with (running_sim(time_scale=20.0, num_gpu_blocks=400) as a,
                running_sim(time_scale=20.0, num_gpu_blocks=400, seed=1) as b):
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": a}, {"url": b}],
            "routing": {"poll_interval_s": 0.05, "queue": {"timeout_s": 50.0}},
        })
        async with running_gateway(settings) as gateway, aiohttp.ClientSession() as http:
            for i in range(6):  # short replies, cut at their max_tokens, teach the gateway
                _, reason, _ = await stream(http, gateway, f"say hi {i}", max_tokens=32)
                assert reason in ("stop", "length")
            before = [await counter(http, sim, "vllm:request_success_total") for sim in (a, b)]
            results = await asyncio.wait_for(asyncio.gather(*(
                stream(http, gateway, f"write a long story number {i}", max_tokens=LONG,
                       ignore_eos=True) for i in range(8))), timeout=50.0)
            preempted = [await counter(http, sim, "vllm:num_preemptions_total")
                         for sim in (a, b)]
            after = [await counter(http, sim, "vllm:request_success_total") for sim in (a, b)]
    assert results == [(LONG, "length", LONG)] * 8  # every stream whole
    assert preempted == [0.0, 0.0]
    assert min(n - m for n, m in zip(after, before, strict=True)) >= 1  # both served
