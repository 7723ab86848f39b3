"""The gateway's picture of its backends, end to end against three simulators of different KV
sizes: `/admin/backends` follows their real occupancy within a poll interval, and a burst sent
between two scrapes spreads by free KV (the ledger counts what the scrape cannot see yet) instead
of piling onto the backend that looked emptiest."""

from __future__ import annotations

import asyncio
from collections import Counter
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
from tests.paths import free_port

MODEL = PRESETS[DEFAULT_PRESET].model_name
SIZES = {"small": 600, "medium": 1200, "large": 2400}  # KV blocks of 16 tokens
DEADLINE_S = 20.0


@asynccontextmanager
async def three_sims(poll_interval_s: float, *, time_scale: float = 20.0, **routing: Any
                     ) -> AsyncIterator[tuple[str, dict[str, str], aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        urls = {
            name: await stack.enter_async_context(
                running_sim(num_gpu_blocks=blocks, time_scale=time_scale, seed=i))
            for i, (name, blocks) in enumerate(SIZES.items())
        }
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": url, "id": name} for name, url in urls.items()],
            "routing": {"poll_interval_s": poll_interval_s, **routing},
        })
        gateway = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield gateway, urls, http


async def rows(http: aiohttp.ClientSession, gateway: str) -> dict[str, dict[str, Any]]:
    async with http.get(gateway + "/admin/backends") as resp:
        return {row["id"]: row for row in orjson.loads(await resp.read())["backends"]}


async def sim_free_blocks(http: aiohttp.ClientSession, sim: str, total: int) -> int:
    """Free blocks by vLLM's own formula, from the simulator's /metrics."""
    async with http.get(sim + "/metrics") as resp:
        text = await resp.text()
    usage = next(sample.value for family in text_string_to_metric_families(text)
                 for sample in family.samples if sample.name == "vllm:kv_cache_usage_perc")
    return round((1.0 - usage) * (total - 1))


def long_chat(tag: str, prompt_chars: int, max_tokens: int, stream: bool) -> dict[str, Any]:
    text = f"{tag} " + "lorem ipsum " * (prompt_chars // 12)
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": text}]}


async def test_admin_backends_follows_real_occupancy_within_a_poll_interval() -> None:
    # Simulated time at twice the real pace: the held stream decodes for about 14 s, far longer
    # than the comparison takes on any host.
    async with three_sims(poll_interval_s=0.05, time_scale=2.0) as (gateway, sims, http):
        loop = asyncio.get_running_loop()
        end = loop.time() + DEADLINE_S
        while not all(row["healthy"] for row in (await rows(http, gateway)).values()):
            assert loop.time() < end, "backends never became healthy"
            await asyncio.sleep(0.02)
        # A long stream holds KV blocks on one backend while we compare the two pictures.
        body = long_chat("hold", prompt_chars=16_000, max_tokens=4000, stream=True)
        async with http.post(gateway + "/v1/chat/completions", json=body) as held:
            assert held.status == 200
            backend = held.headers["x-kvgate-backend"]
            await held.content.readany()
            total = SIZES[backend]
            # While the stream decodes, its free blocks only fall. The gateway's figure is
            # right when it lies between the simulator's own figure read just before and just
            # after it (a scrape between the two reads), which happens within a poll interval
            # or two; a stale or wrong figure never does.
            while True:
                before = await sim_free_blocks(http, sims[backend], total)
                seen = (await rows(http, gateway))[backend]
                after = await sim_free_blocks(http, sims[backend], total)
                if before < total - 1 and after <= seen["kv_free_blocks"] <= before:
                    break
                assert loop.time() < end, (
                    f"admin shows {seen['kv_free_blocks']}, sim {before} then {after}")
                await asyncio.sleep(0.02)
            assert seen["kv_total_blocks"] == total and seen["block_size"] == 16
            assert seen["running"] == 1 and seen["inflight"] == 1
            assert seen["last_poll_age_ms"] is not None and seen["reserved_blocks"] > 0


async def test_a_burst_between_two_scrapes_spreads_by_free_kv_instead_of_herding() -> None:
    # One scrape at start-up, then none for a minute: the whole burst lands between two scrapes,
    # and only the gateway's own ledger tells it what the burst has already taken.
    async with three_sims(poll_interval_s=60.0, max_snapshot_age_s=120.0,
                          queue={"timeout_s": 60.0}) as (gateway, _, http):
        loop = asyncio.get_running_loop()
        end = loop.time() + DEADLINE_S
        while not all(row["kv_total_blocks"] for row in (await rows(http, gateway)).values()):
            assert loop.time() < end, "the first scrape never arrived"
            await asyncio.sleep(0.02)

        async def one(i: int) -> tuple[int, str | None]:
            body = long_chat(f"burst {i}", prompt_chars=6_000, max_tokens=64, stream=False)
            async with http.post(gateway + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                return resp.status, resp.headers.get("x-kvgate-backend")

        answers = await asyncio.gather(*(one(i) for i in range(50)))
        assert {status for status, _ in answers} == {200}
        counts = Counter(backend for _, backend in answers)
        # Every backend got a share, and the shares follow free KV: no single backend took the
        # burst, and the smallest cache took the fewest (seen: small 6-10, medium 18-22, large 22).
        assert set(counts) == set(SIZES), counts
        assert counts["small"] < min(counts["medium"], counts["large"]), counts
        assert max(counts.values()) < 50 * 0.8, counts
        assert all(row["inflight"] == 0 for row in (await rows(http, gateway)).values())


async def test_the_gateway_listens_once_it_has_read_every_backends_kv_size() -> None:
    """A request that arrives the moment the gateway is up is routed against a real reading:
    the listener opens after each backend's first scrape has ended, so `/admin/backends`'s
    first answer already holds every reachable backend's KV size, and a backend on a closed
    port does not hold the start back past one poll interval and a scrape timeout."""
    async with AsyncExitStack() as stack:
        urls = {
            name: await stack.enter_async_context(running_sim(num_gpu_blocks=blocks, seed=i))
            for i, (name, blocks) in enumerate(SIZES.items())
        }
        backends = [{"url": url, "id": name} for name, url in urls.items()]
        backends.append({"url": f"http://127.0.0.1:{free_port()}", "id": "closed",
                         "models": [MODEL]})
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": backends,
            # Seconds between scrapes: only the first one can have been read at the start.
            "routing": {"poll_interval_s": 2.0},
        })
        gateway = await stack.enter_async_context(running_gateway(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        first = await rows(http, gateway)
    assert {name: first[name]["kv_total_blocks"] for name in SIZES} == {
        name: blocks for name, blocks in SIZES.items()}
    assert first["closed"]["kv_total_blocks"] is None
