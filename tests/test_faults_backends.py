"""Fault rows: backends that die, freeze, error or lose their metrics, and the gateway in front
of them. Each row asserts that no request is lost (every client gets an answer or an error it
can parse), the promised statuses and headers, recovery without restarting the gateway, and
(tests/faults/rows.py) descriptors back to their baseline and memory flat over three
repetitions. Simulators and the misbehaving upstream run as subprocesses the rows SIGKILL,
SIGSTOP and SIGCONT."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from uuid import uuid4

import aiohttp
import pytest

from tests.faults import procs
from tests.faults.clients import (
    Answer,
    assert_none_lost,
    chat_body,
    get_json,
    send,
    send_many,
)
from tests.faults.misbehave import RETRY_AFTER_S
from tests.faults.rows import backend_rows, three_times, until_healthy
from tests.waiting import until

ROUND_ROBIN = {"policy": "round_robin", "poll_interval_s": 0.1}
FAST_EJECTION = {"consecutive_failures": 3, "base_ejection_s": 1.0}



async def streams_begun(url: str, count: int, fault: asyncio.Event, *, max_tokens: int,
                        deadline_s: float = 45.0) -> list[Answer]:
    """`count` long streams; `fault` is set once every one has its first bytes."""
    begun = 0

    def first() -> None:
        nonlocal begun
        begun += 1
        if begun == count:
            fault.set()

    body = chat_body(max_tokens=max_tokens, ignore_eos=True)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        answers = await asyncio.gather(
            *(send(http, url, body, on_first=first, deadline_s=deadline_s)
              for _ in range(count)))
    return list(answers)


async def test_a_backend_killed_during_100_streams_ends_its_streams_with_an_error_event() -> None:
    port = procs.free_port()
    async with AsyncExitStack() as stack:
        healthy = await stack.enter_async_context(procs.sim(seed=1))
        # The row is about the kill: a first byte slow to come while 100 streams start on a
        # busy host must not be a timeout of its own.
        config = procs.gateway_config([f"http://127.0.0.1:{port}", healthy.url],
                                      routing=ROUND_ROBIN, health=FAST_EJECTION,
                                      server={"first_byte_timeout_s": 30})
        victim = await stack.enter_async_context(procs.sim(port=port))
        gateway = await stack.enter_async_context(procs.gateway(config))
        await until_healthy(gateway, "b0", "b1")

        async def row() -> None:
            nonlocal victim
            fault = asyncio.Event()
            streams = asyncio.ensure_future(
                streams_begun(gateway.url, 100, fault, max_tokens=300))
            await asyncio.wait_for(fault.wait(), 60)
            victim.kill()
            answers = await streams
            kinds = assert_none_lost(answers)
            cut = [a for a in answers if a.kind == "error"]
            assert cut and all(a.status == 200 and a.backend == "b0" for a in cut), kinds
            assert all(a.backend == "b1" for a in answers if a.kind == "ok" and a.backend)
            after = await send_many(gateway.url, [chat_body()] * 10)
            assert all(a.kind == "ok" for a in after), [a.why for a in after]
            victim = await stack.enter_async_context(procs.sim(port=port))  # it comes back
            await until_healthy(gateway, "b0")

        await three_times(gateway, row)


async def to_freeze_beside_a_healthy_one(stack: AsyncExitStack) -> tuple[procs.Proc, procs.Proc]:
    """Two simulators (b0, the one a row freezes; b1) behind a round-robin gateway."""
    frozen = await stack.enter_async_context(procs.sim())
    healthy = await stack.enter_async_context(procs.sim(seed=1))
    gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
        [frozen, healthy], routing=ROUND_ROBIN, health=FAST_EJECTION)))
    await until_healthy(gateway, "b0", "b1")
    return frozen, gateway


async def test_a_backend_frozen_before_the_first_byte_costs_one_retry_not_an_error() -> None:
    async with AsyncExitStack() as stack:
        frozen, gateway = await to_freeze_beside_a_healthy_one(stack)

        async def row() -> None:
            # Waves of 4 at once: each puts 2 on the frozen backend, within the retry budget's
            # floor of 3 concurrent retries, until the timeouts eject it.
            frozen.freeze()
            answers: list[Answer] = []
            try:
                for _wave in range(5):  # distinct questions: none is a cache hit
                    answers += await send_many(
                        gateway.url, [chat_body(stream=i % 2 == 0, text=f"hello {uuid4().hex}")
                                      for i in range(4)], deadline_s=30)
            finally:
                frozen.thaw()
            assert_none_lost(answers)
            assert all(a.kind == "ok" and a.backend == "b1" for a in answers), \
                [(a.kind, a.status, a.why, a.backend) for a in answers if a.backend != "b1"]
            await until_healthy(gateway, "b0")

        await three_times(gateway, row)


async def test_a_backend_frozen_mid_stream_ends_its_streams_with_an_error_event() -> None:
    async with AsyncExitStack() as stack:
        frozen, gateway = await to_freeze_beside_a_healthy_one(stack)

        async def row() -> None:
            fault = asyncio.Event()
            streams = asyncio.ensure_future(
                streams_begun(gateway.url, 20, fault, max_tokens=400, deadline_s=25))
            await asyncio.wait_for(fault.wait(), 60)
            frozen.freeze()
            try:
                answers = await streams
            finally:
                frozen.thaw()
            assert_none_lost(answers)
            on_frozen = [a for a in answers if a.backend == "b0"]
            assert on_frozen and all(a.kind == "error" for a in on_frozen)
            assert all(a.kind == "ok" for a in answers if a.backend == "b1")
            await until_healthy(gateway, "b0")

        await three_times(gateway, row)


@pytest.mark.parametrize(("mode", "most_tried"), [
    pytest.param("500", 3 + 3, id="500s eject it after consecutive_failures and are retried"),
    pytest.param("503", 3 + 3, id="503s eject it although its scrapes are good, retried"),
    pytest.param("429", 1 + 3, id="a 429 with Retry-After holds traffic off it, not ejected"),
])
async def test_a_backend_erroring_while_its_metrics_look_fine(mode: str, most_tried: int) -> None:
    async with AsyncExitStack() as stack:
        bad = await stack.enter_async_context(procs.misbehaving(mode, "good"))
        healthy = await stack.enter_async_context(procs.sim())
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [bad, healthy], routing=ROUND_ROBIN,
            health={**FAST_EJECTION, "base_ejection_s": 30.0})))
        await until_healthy(gateway, "b0", "b1")
        tried_before = 0

        async def row() -> None:
            nonlocal tried_before
            answers: list[Answer] = []
            for _ in range(10):  # 3 at a time, 30 in all
                answers += await send_many(gateway.url, [chat_body(stream=False)] * 3)
            assert_none_lost(answers)
            assert all(a.kind == "ok" for a in answers), \
                [(a.status, a.why) for a in answers if a.kind != "ok"]
            tried = (await procs.upstream_stats(bad))["chat"]
            assert tried - tried_before <= most_tried, f"b0 was tried {tried - tried_before}x"
            tried_before = tried
            row_b0 = (await backend_rows(gateway))["b0"]
            if mode == "429":
                assert row_b0.get("ejected_until") is None, row_b0
            else:
                assert row_b0.get("ejected_until") is not None, row_b0

        await three_times(gateway, row)


@pytest.mark.parametrize(("mode", "status", "retry_after", "streams"), [
    pytest.param("429", 429, str(RETRY_AFTER_S), (False, True),
                 id="a 429 keeps its status and Retry-After"),
    pytest.param("503", 503, None, (False, True),
                 id="a 503 is relayed as a 503 with a Retry-After"),
    pytest.param("500", 500, None, (False, True),
                 id="a 500 keeps its status and the backend's message"),
])
async def test_an_upstream_error_is_relayed_with_its_status_retry_after_and_message(
        mode: str, status: int, retry_after: str | None, streams: tuple[bool, ...]) -> None:
    async with AsyncExitStack() as stack:
        bad = await stack.enter_async_context(procs.misbehaving(mode, "good"))
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [bad], health={"consecutive_failures": 1000})))
        await until_healthy(gateway, "b0")
        relayed: list[int] = []  # statuses of the backend's own answers

        async def row() -> None:
            answers = await send_many(gateway.url, [chat_body(stream=s) for s in streams])
            assert_none_lost(answers)
            for answer in answers:
                if answer.why == "no_healthy_backend":
                    # The backend's Retry-After holds traffic off it: while the hold lasts, the
                    # gateway answers for it, with a Retry-After no later than the backend's.
                    assert mode == "429" and answer.status == 503, answer
                    assert 1 <= int(answer.headers["retry-after"]) <= RETRY_AFTER_S, answer
                    continue
                assert (answer.kind, answer.status) == ("error", status), answer
                assert answer.message, answer  # the backend's own words, not a bare status
                if status in (429, 503):
                    assert "retry-after" in answer.headers, answer.headers
                if retry_after is not None:
                    assert answer.headers["retry-after"] == retry_after
                assert "keep-alive" not in answer.headers  # no hop-by-hop header relayed
            relayed.extend(a.status for a in answers if a.why != "no_healthy_backend")
            if mode == "500":
                assert "CUDA error" in answers[0].message, answers[0]

        await three_times(gateway, row)
        assert relayed and set(relayed) == {status}, relayed  # the first got the backend's own


@pytest.mark.parametrize("metrics", [
    pytest.param("garbage", id="metrics that do not parse: stale, still routed"),
    pytest.param("404", id="no metrics endpoint: stale, still routed"),
    pytest.param("hang", id="metrics that never answer: stale, still routed"),
])
async def test_a_backend_with_broken_metrics_whose_chat_works_stays_in_rotation(
        metrics: str) -> None:
    async with AsyncExitStack() as stack:
        blind = await stack.enter_async_context(procs.misbehaving("ok", metrics))
        healthy = await stack.enter_async_context(procs.sim())
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [blind, healthy], routing={"poll_interval_s": 0.1, "scrape_timeout_s": 0.3})))

        async def scraped() -> bool:
            return int((await procs.upstream_stats(blind))["metrics"]) >= 6
        await until(scraped, "the broken metrics scraped a few times", 30)

        async def row() -> None:
            before = (await procs.upstream_stats(blind))["chat"]
            answers: list[Answer] = []
            for _ in range(10):
                answers += await send_many(gateway.url, [chat_body(stream=False)] * 4)
            assert all(a.kind == "ok" for a in answers), [a.why for a in answers if a.kind != "ok"]
            assert (await procs.upstream_stats(blind))["chat"] > before, "b0 left the rotation"
            assert (await backend_rows(gateway))["b0"].get("stale") is True

        await three_times(gateway, row)


async def test_every_backend_down_is_503_with_retry_after_then_they_come_back() -> None:
    ports = [procs.free_port(), procs.free_port()]
    async with AsyncExitStack() as stack:
        fleet = [await stack.enter_async_context(procs.sim(port=p, seed=i))
                 for i, p in enumerate(ports)]
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(fleet)))
        await until_healthy(gateway, "b0", "b1")

        async def ready_status() -> int:
            return (await get_json(gateway.url, "/ready"))[0]

        async def row() -> None:
            for backend in fleet:
                backend.kill()
                await backend.wait()
            async def unready() -> bool:
                return await ready_status() == 503
            await until(unready, "/ready 503 with every backend dead")
            answers = await send_many(gateway.url, [chat_body(stream=i % 2 == 0)
                                                    for i in range(10)], deadline_s=10)
            assert_none_lost(answers)
            for answer in answers:
                assert (answer.status, answer.why) == (503, "no_healthy_backend"), answer
                assert answer.headers.get("retry-after", "").isdigit(), answer.headers
            fleet[:] = [await stack.enter_async_context(procs.sim(port=p, seed=i))
                        for i, p in enumerate(ports)]
            await until_healthy(gateway, "b0", "b1")
            assert await ready_status() == 200
            back = await send_many(gateway.url, [chat_body()] * 10)
            assert all(a.kind == "ok" for a in back), [a.why for a in back]

        await three_times(gateway, row)

