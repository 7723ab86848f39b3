"""A client that hangs up, streaming or not, makes the backend abort at once: the simulator's abort
counter rises and its running count falls within a second, and the gateway's in-flight count
returns to zero."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
ABORT_DEADLINE_S = 1.0  # the contract: the backend sees the abort within a second
SETUP_DEADLINE_S = 10.0
# Long enough that the request is still generating when the client hangs up.
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}],
        "max_tokens": 4000, "ignore_eos": True}


@dataclass(frozen=True)
class Rig:
    gateway: str
    sim: str
    http: aiohttp.ClientSession
    outcomes: list[Outcome]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running_sim(time_scale=1.0) as sim:
        settings = Settings.model_validate({"server": {"port": 0}, "backends": [{"url": sim}]})
        outcomes: list[Outcome] = []
        async with running_gateway(settings, on_done=outcomes.append) as gateway, \
                aiohttp.ClientSession() as http:
            yield Rig(gateway, sim, http, outcomes)


async def sim_counts(rig: Rig) -> tuple[float, float]:
    """(aborted requests so far, requests running now) from the simulator's /metrics."""
    async with rig.http.get(rig.sim + "/metrics") as resp:
        text = await resp.text()
    aborted = running = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_success_total" and \
                    sample.labels.get("finished_reason") == "abort":
                aborted += sample.value
            elif sample.name == "vllm:num_requests_running":
                running += sample.value
    return aborted, running


async def wait_for(check: Callable[[], Awaitable[bool]], deadline_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not await check():
        assert loop.time() < end, f"not within {deadline_s} s: {what}"
        await asyncio.sleep(0.01)


async def gateway_inflight(rig: Rig) -> int:
    async with rig.http.get(rig.gateway + "/admin/backends") as resp:
        rows = orjson.loads(await resp.read())["backends"]
    return sum(int(row["inflight"]) for row in rows)


async def assert_backend_aborts(rig: Rig, aborted_before: float) -> None:
    async def aborted() -> bool:
        count, running = await sim_counts(rig)
        return count == aborted_before + 1 and running == 0

    await wait_for(aborted, ABORT_DEADLINE_S, "the simulator aborts the request")

    async def released() -> bool:
        return await gateway_inflight(rig) == 0

    await wait_for(released, ABORT_DEADLINE_S, "the gateway releases its in-flight count")
    assert [o.client_disconnected for o in rig.outcomes] == [True]


async def test_hanging_up_mid_stream_aborts_the_backend_request(rig: Rig) -> None:
    aborted_before, _ = await sim_counts(rig)
    resp = await rig.http.post(rig.gateway + "/v1/chat/completions",
                               json={**LONG, "stream": True})
    assert resp.status == 200
    seen = b""
    while b'"content":"' not in seen.replace(b'"content":""', b""):
        seen += await resp.content.readany()
    assert (await sim_counts(rig))[1] == 1
    resp.close()  # the client hangs up mid-stream
    await assert_backend_aborts(rig, aborted_before)


async def test_hanging_up_before_a_non_streamed_answer_aborts_the_backend_request(
    rig: Rig,
) -> None:
    aborted_before, _ = await sim_counts(rig)
    request = asyncio.create_task(rig.http.post(rig.gateway + "/v1/chat/completions", json=LONG))

    async def running() -> bool:
        return (await sim_counts(rig))[1] == 1

    await wait_for(running, SETUP_DEADLINE_S, "the simulator starts the request")
    request.cancel()  # the client gives up: aiohttp closes its connection
    with pytest.raises(asyncio.CancelledError):
        await request
    await assert_backend_aborts(rig, aborted_before)
