"""Routing by cost and free KV, end to end, against simulators of unequal size and load on
loopback: long-context requests avoid the backend near KV exhaustion while short ones still use
it; with the whole fleet saturated, requests wait at the gateway, the simulators never preempt,
and nothing is lost (every request completes or gets a clear 429/503)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ConfigError, Settings, load_settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
DEADLINE_S = 20.0


@asynccontextmanager
async def fleet(*sims: dict[str, Any], **routing: Any
                ) -> AsyncIterator[tuple[str, dict[str, str], aiohttp.ClientSession]]:
    """Simulators by id (running_sim keywords) behind one gateway; yields (gateway, sims, http)."""
    async with AsyncExitStack() as stack:
        urls = {}
        for options in sims:
            options = dict(options)
            backend_id = options.pop("id")
            urls[backend_id] = await stack.enter_async_context(running_sim(**options))
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": url, "id": backend_id} for backend_id, url in urls.items()],
            "routing": {"poll_interval_s": 0.05, **routing},
        })
        gateway = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield gateway, urls, http


async def wait_for(check: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not await check():
        assert loop.time() < end, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.02)


async def preemptions(http: aiohttp.ClientSession, sim: str) -> float:
    async with http.get(sim + "/metrics") as resp:
        text = await resp.text()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == "vllm:num_preemptions_total")


async def backend_rows(http: aiohttp.ClientSession, gateway: str) -> dict[str, dict[str, Any]]:
    async with http.get(gateway + "/admin/backends") as resp:
        return {row["id"]: row for row in orjson.loads(await resp.read())["backends"]}


def chat(text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "ignore_eos": True, **extra}


async def send(http: aiohttp.ClientSession, gateway: str, body: dict[str, Any]
               ) -> tuple[int, str | None, float, str]:
    """(status, backend, queue ms, route header) of one request."""
    async with http.post(gateway + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return (resp.status, resp.headers.get("x-kvgate-backend"),
                float(resp.headers.get("x-kvgate-queue-ms", "0")),
                resp.headers.get("x-kvgate-route", ""))


async def test_long_context_requests_avoid_the_backend_near_kv_exhaustion_short_ones_still_use_it(
) -> None:
    small = {"id": "small", "num_gpu_blocks": 400, "time_scale": 1.0}  # 6,400 tokens of KV
    big = {"id": "big", "num_gpu_blocks": 4000, "time_scale": 1.0}
    async with fleet(small, big) as (gateway, sims, http):
        # Someone else's long request fills three quarters of the small backend's KV: ~4,800
        # prompt tokens (300 blocks), still decoding throughout the test.
        filler = await http.post(sims["small"] + "/v1/chat/completions",
                                 json=chat("word " * 4800, 1500, stream=True))
        assert filler.status == 200

        async def small_is_nearly_full() -> bool:
            usage = (await backend_rows(http, gateway))["small"]["kv_usage"]
            return usage is not None and usage > 0.74

        await wait_for(small_is_nearly_full, "the gateway sees the small backend nearly full")
        longs = [chat(f"long {i} " + "word " * 2000, 16) for i in range(4)]  # ~125+ blocks each
        shorts = [chat(f"short {i}: hello there", 4) for i in range(12)]
        results = await asyncio.gather(*(send(http, gateway, body) for body in longs + shorts))
        filler.close()

        assert all(status == 200 for status, *_ in results)
        assert [backend for _, backend, *_ in results[:4]] == ["big"] * 4
        # The shorts fit the small backend; the big one is busy prefilling the longs.
        short_homes = Counter(backend for _, backend, *_ in results[4:])
        assert short_homes["small"] >= 1
        assert all(route.startswith("policy=cost; ttft_ms=") for *_, route in results)
        for sim in sims.values():
            assert await preemptions(http, sim) == 0


async def test_with_the_fleet_saturated_requests_wait_at_the_gateway_and_nothing_is_lost(
) -> None:
    sims = ({"id": "a", "num_gpu_blocks": 300, "time_scale": 20.0},
            {"id": "b", "num_gpu_blocks": 600, "time_scale": 20.0})
    async with fleet(*sims) as (gateway, urls, http):
        # ~35 KV blocks each at their peak: the two backends hold ~23 of the 60 at once.
        bodies = [chat(f"{i} " + "word " * 400, 100) for i in range(60)]
        results = await asyncio.gather(*(send(http, gateway, body) for body in bodies))

        statuses = Counter(status for status, *_ in results)
        assert set(statuses) <= {200, 429, 503} and sum(statuses.values()) == 60
        assert statuses[200] >= 1
        assert sum(1 for _, _, queue_ms, _ in results if queue_ms > 0) >= 10
        assert {backend for status, backend, *_ in results if status == 200} == {"a", "b"}
        for url in urls.values():
            assert await preemptions(http, url) == 0

        async def drained() -> bool:
            rows = await backend_rows(http, gateway)
            return all(row["inflight"] == 0 and row["reserved_blocks"] == 0
                       for row in rows.values())

        await wait_for(drained, "every lease is released")


# The routing section of the config.

def test_routing_defaults() -> None:
    routing = load_settings(None, environ={}).routing
    assert (routing.policy, routing.admission, routing.high_water) == ("cost", True, 0.9)
    assert (routing.queue.max_depth, routing.queue.timeout_s) == (1024, 30.0)
    assert routing.queue.max_per_tenant is None
    assert (routing.priority_header, routing.tenant_header) == ("x-kvgate-priority",
                                                               "x-kvgate-tenant")
    assert routing.session_header is None and routing.tokenizers == {}


@pytest.mark.parametrize(
    ("environ", "names"),
    [({"KVGATE_ADVANCED__WEIGHTS": '{"queue": 1}'}, "advanced.weights"),
     ({"KVGATE_ROUTING__POLICY": "kv_util", "KVGATE_ADVANCED__WEIGHTS": '{"ttft": 1}'},
      "advanced.weights"),
     ({"KVGATE_ADVANCED__WEIGHTS": '{"ttft": -1}'}, "advanced.weights"),
     ({"KVGATE_ROUTING__HIGH_WATER": "1.5"}, "routing.high_water"),
     ({"KVGATE_ROUTING__QUEUE__TIMEOUT_S": "0"}, "routing.queue.timeout_s"),
     ({"KVGATE_ROUTING__QUEUE__MAX_PER_TENANT": "0"}, "routing.queue.max_per_tenant")],
    ids=["a weight for a scorer the policy lacks", "weights are checked against the policy",
         "a negative weight", "a high-water mark above 1", "a zero queue timeout",
         "a zero tenant share"],
)
def test_bad_routing_config_fails_at_start_naming_the_field(environ: dict[str, str],
                                                            names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_settings(None, environ=environ)


def test_a_configured_tokenizer_without_the_tokenizers_package_fails_at_start(
        tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    environ = {"KVGATE_ROUTING__TOKENIZERS": orjson.dumps({MODEL: str(path)}).decode()}
    if importlib.util.find_spec("tokenizers") is None:
        with pytest.raises(ConfigError, match=r"routing\.tokenizers.*'tokenizers' package"):
            load_settings(None, environ=environ)
    missing = {"KVGATE_ROUTING__TOKENIZERS": orjson.dumps({MODEL: "/nowhere.json"}).decode()}
    with pytest.raises(ConfigError, match=r"routing\.tokenizers"):
        load_settings(None, environ=missing)
