"""The gateway in front of a real llama.cpp `llama-server` (built by scripts/real-engines.sh from
llama-cpp-python's vendored llama.cpp, serving SmolLM2-135M-Instruct, 2 slots of 2,048 tokens):
what it reads is what the server's /metrics and /slots say, and the openai client gets through
it the stream it gets from the server. Skipped unless KVGATE_ENGINES is set
(tests/engines/launch.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionUserMessageParam

from gateway.config import Settings
from gateway.serve import running_gateway
from tests.engines.launch import LLAMACPP_CONTEXT, LLAMACPP_MODEL, Engine, running_engines
from tests.engines.readings import admin_row, llamacpp_row
from tests.waiting import until

pytestmark = pytest.mark.timeout(600)

MESSAGES = [ChatCompletionUserMessageParam(role="user", content="Tell me about the gateway.")]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with running_engines([("llamacpp", ())],
                         log_dir=tmp_path_factory.mktemp("llamacpp-logs")) as [started]:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def gateway(engine: Engine) -> AsyncIterator[str]:
    settings = Settings.model_validate({
        "server": {"port": 0},
        "backends": [{"url": engine.url, "metrics_format": "llamacpp"}],
        "slo": {"admission": False},
    })
    async with running_gateway(settings) as url:
        yield url


async def test_admin_backends_is_what_llama_servers_metrics_and_slots_say(
        engine: Engine, gateway: str, http: aiohttp.ClientSession) -> None:
    idle = await llamacpp_row(http, engine.url)
    assert (idle["kv_total_blocks"], idle["block_size"]) == (LLAMACPP_CONTEXT, 1)
    body = {"model": LLAMACPP_MODEL, "messages": MESSAGES, "max_tokens": 1000, "stream": True}
    load = await http.post(engine.url + "/v1/chat/completions", json=body)
    assert load.status == 200
    try:
        async def bracketed() -> bool:
            # The used tokens grow with every token, so the gateway's reading is checked
            # between two of the server's own, taken just before and just after it.
            before = await llamacpp_row(http, engine.url)
            row = await admin_row(http, gateway)
            after = await llamacpp_row(http, engine.url)
            used = row["kv_total_blocks"] - row["kv_free_blocks"]
            return bool(before["running"] == after["running"] == row["running"] == 1
                    and row["waiting"] == 0 and row["block_size"] == 1
                    and row["kv_total_blocks"] == LLAMACPP_CONTEXT
                    and 0 < before["kv_total_blocks"] - before["kv_free_blocks"] <= used
                    and used <= after["kv_total_blocks"] - after["kv_free_blocks"]
                    and abs(row["kv_usage"] - used / LLAMACPP_CONTEXT) < 1e-9)
        await until(bracketed, "the gateway's row within llama-server's readings under load")
    finally:
        load.close()


def shape(chunk: Any) -> Any:
    """A chunk as the client parsed it, without what differs between any two streams: ids,
    times, and the values of llama-server's `timings` (their keys stay)."""
    if isinstance(chunk, dict):
        return {key: sorted(value) if key == "timings" else shape(value)
                for key, value in chunk.items() if key not in ("id", "created")}
    if isinstance(chunk, list):
        return [shape(item) for item in chunk]
    return chunk


async def openai_chunks(base: str) -> list[Any]:
    async with AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=LLAMACPP_MODEL, messages=MESSAGES, max_tokens=8, temperature=0.0, seed=1,
            stream=True)
        return [chunk.model_dump(exclude_unset=True) async for chunk in stream]


async def test_the_openai_client_streams_through_the_gateway_what_llama_server_sends_it(
        engine: Engine, gateway: str) -> None:
    direct = await openai_chunks(engine.url)
    relayed = await openai_chunks(gateway)
    assert direct and "system_fingerprint" in direct[-1], direct[-1:]
    assert [shape(c) for c in relayed] == [shape(c) for c in direct]
