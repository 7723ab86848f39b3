"""The gateway in front of real vLLM servers (the CPU build, scripts/real-engines.sh, a tiny
random-weight Llama, 40 KV blocks of 128 tokens each): what it reads is what vLLM says, what it
relays is what vLLM sent, a hang-up aborts the request in vLLM, and its reservations keep vLLM
from preempting. Skipped unless KVGATE_ENGINES is set (tests/engines/launch.py)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionUserMessageParam

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest import bench_poller_engine
from tests.engines.launch import (
    VLLM_BLOCK_SIZE,
    VLLM_BLOCKS,
    VLLM_MAX_MODEL_LEN,
    VLLM_MODEL,
    Engine,
    running_engines,
)
from tests.engines.readings import admin_row, agrees, scrape, value, vllm_row
from tests.waiting import until

# Two vLLM starts, a minute or two each on a loaded 2-core host, then the tests.
pytestmark = pytest.mark.timeout(2400)

ABORT_DEADLINE_S = 0.5  # a hang-up ends the request in vLLM within this
LONG_TOKENS = 1500
MESSAGES = [ChatCompletionUserMessageParam(role="user", content="Tell me about the gateway.")]
LONG = {"model": VLLM_MODEL, "messages": MESSAGES, "max_tokens": LONG_TOKENS,
        "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Engine]]:
    """Two vLLM servers of 40 blocks each, for the whole module (a start takes minutes)."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    blocks = str(VLLM_BLOCKS)
    with running_engines([("vllm", (blocks,)), ("vllm", (blocks,))], log_dir=logs) as started:
        yield started


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def settings(*engines: Engine, **routing: Any) -> Settings:
    return Settings.model_validate({
        "server": {"port": 0},
        "backends": [{"url": engine.url, "metrics_format": "vllm"} for engine in engines],
        "routing": {"queue": {"timeout_s": 600.0}, **routing},
        "slo": {"admission": False},  # a CPU engine is far slower than any GPU's SLO
    })


@pytest.fixture
async def gateway(engines: list[Engine]) -> AsyncIterator[str]:
    """A gateway in front of the first server alone."""
    async with running_gateway(settings(engines[0])) as url:
        yield url


async def stream_until_text(http: aiohttp.ClientSession, url: str,
                            body: dict[str, Any]) -> aiohttp.ClientResponse:
    """A streaming POST whose response is open and has sent its first text."""
    resp = await http.post(url + "/v1/chat/completions", json=body)
    assert resp.status == 200, await resp.text()
    async for line in resp.content:
        if b'"content":"' in line and b'"content":""' not in line:
            return resp
    raise AssertionError("the stream ended before any text")


async def test_admin_backends_is_what_vllms_own_metrics_say(
        engines: list[Engine], gateway: str, http: aiohttp.ClientSession) -> None:
    engine = engines[0]
    idle = vllm_row(await scrape(http, engine.url))
    assert (idle["kv_total_blocks"], idle["block_size"]) == (VLLM_BLOCKS, VLLM_BLOCK_SIZE)
    # Straight to vLLM: a busy server. The tiny model decodes a block every few tenths of a
    # second and ends a long reply within seconds, so the gateway's row (read between two of
    # the test's own scrapes) must equal the reading before or after it, while one request
    # runs; a stream that has ended is replaced.
    loads = [await stream_until_text(http, engine.url, LONG)]
    seen: list[tuple[Any, ...]] = []

    async def matches() -> bool:
        before = vllm_row(await scrape(http, engine.url))
        row = await admin_row(http, gateway)
        after = vllm_row(await scrape(http, engine.url))
        seen[:] = [(dict(row), before, after)]
        if before["running"] == 0 and after["running"] == 0:
            loads.append(await stream_until_text(http, engine.url, LONG))
            return False
        return any(reading["running"] == 1 and reading["kv_usage"] > 0
                   and agrees(row, reading) for reading in (before, after))
    try:
        await until(matches, "the gateway's row equals vLLM's /metrics under load", 30.0)
    except AssertionError as failed:
        raise AssertionError(f"{failed}; the last row and readings around it: {seen}") from None
    finally:
        for load in loads:
            load.close()


def shape(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk as the client parsed it, without what differs between any two streams."""
    return {key: value for key, value in chunk.items() if key not in ("id", "created")}


async def openai_chunks(base: str) -> list[dict[str, Any]]:
    async with AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=VLLM_MODEL, messages=MESSAGES, max_tokens=8, temperature=0.0, seed=1,
            stream=True)
        return [chunk.model_dump(exclude_unset=True) async for chunk in stream]


async def test_the_openai_client_streams_through_the_gateway_what_vllm_sends_it(
        engines: list[Engine], gateway: str) -> None:
    direct = await openai_chunks(engines[0].url)
    relayed = await openai_chunks(gateway)
    assert direct and "system_fingerprint" in direct[-1], direct[-1:]
    # vLLM merges tokens into one chunk when its client reads late, so the chunks' boundaries
    # depend on timing; their shape, the text and the last chunk do not.
    assert {tuple(sorted(shape(c))) for c in relayed} == {tuple(sorted(shape(c))) for c in direct}
    assert text_of(relayed) == text_of(direct)
    last = [(c.get("system_fingerprint"), [ch.get("finish_reason") for ch in c["choices"]])
            for c in (relayed[-1], direct[-1])]
    assert last[0] == last[1], last


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(choice.get("delta", {}).get("content") or ""
                   for chunk in chunks for choice in chunk.get("choices", ()))


async def test_a_client_hanging_up_ends_the_request_in_vllm(
        engines: list[Engine], gateway: str, http: aiohttp.ClientSession) -> None:
    engine = engines[0]

    async def running() -> float:
        return value(await scrape(http, engine.url), "vllm:num_requests_running")

    await until(lambda: _is(running, 0.0), "vLLM idle before the test")
    resp = await stream_until_text(http, gateway, LONG)
    await until(lambda: _is(running, 1.0), "the stream running in vLLM")
    resp.close()
    await until(lambda: _is(running, 0.0), "vLLM's running count back to 0 after the hang-up",
                timeout_s=ABORT_DEADLINE_S)


async def _is(read: Any, expected: float) -> bool:
    return bool(await read() == expected)


async def test_an_over_long_prompt_gets_vllms_400_unchanged(
        engines: list[Engine], gateway: str, http: aiohttp.ClientSession) -> None:
    body = {"model": VLLM_MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": "gateway " * (2 * VLLM_MAX_MODEL_LEN)}]}
    answers = []
    for url in (engines[0].url, gateway):
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            answers.append((resp.status, orjson.loads(await resp.read())["error"]["message"]))
    direct, relayed = answers
    assert direct[0] == 400 and str(VLLM_MAX_MODEL_LEN) in direct[1]
    assert relayed == direct


STREAMS = 8


async def run_stream(http: aiohttp.ClientSession, gateway: str) -> str | None:
    """The finish reason of one long ignore_eos stream."""
    finish = None
    async with http.post(gateway + "/v1/chat/completions", json=LONG) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices", ()):
                finish = choice.get("finish_reason") or finish
    return finish


async def test_two_servers_take_eight_long_ignore_eos_streams_without_a_preemption(
        engines: list[Engine], http: aiohttp.ClientSession) -> None:
    before = [await scrape(http, engine.url) for engine in engines]
    started = time.monotonic()
    async with running_gateway(settings(*engines)) as gateway:
        # Traffic after the first scrapes: before any, the gateway knows no server's KV size.
        async def scraped() -> bool:
            async with http.get(gateway + "/admin/backends") as resp:
                rows = orjson.loads(await resp.read())["backends"]
            return all(row["kv_total_blocks"] for row in rows)

        await until(scraped, "both servers' KV sizes read by the gateway", 60.0)
        results = await asyncio.gather(*(run_stream(http, gateway) for _ in range(STREAMS)))
    after = [await scrape(http, engine.url) for engine in engines]
    took = time.monotonic() - started
    assert results == ["length"] * STREAMS, results
    preemptions = [value(a, "vllm:num_preemptions_total") - value(b, "vllm:num_preemptions_total")
                   for a, b in zip(after, before, strict=True)]
    served = [value(a, "vllm:request_success_total") - value(b, "vllm:request_success_total")
              for a, b in zip(after, before, strict=True)]
    assert preemptions == [0, 0], f"preemptions {preemptions}, served {served}, {took:.0f} s"
    assert all(n > 0 for n in served) and sum(served) == STREAMS, served


async def test_the_poller_benchmark_reads_a_real_vllm_at_every_interval(
        engines: list[Engine]) -> None:
    args = argparse.Namespace(url=engines[0].url, seconds=1.0, warmup=0.5, streams=1)
    table = await bench_poller_engine.run(args)
    assert [row[0] for row in table.rows] == ["idle", "1 streams"]
    assert all(row[1] > 10 and row[2] > 0 for row in table.rows), table.rows  # KB, scrapes/s
