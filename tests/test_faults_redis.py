"""Fault row: the shared response cache's Redis killed, frozen and restarted under traffic. The
cache fails open (gateway/cache/): every request is answered while the store is gone or hangs,
and hits come back once Redis is back on its address, without restarting the gateway."""

from __future__ import annotations

from contextlib import AsyncExitStack

import aiohttp

from tests.faults import procs
from tests.faults.clients import Answer, assert_none_lost, chat_body, send, send_many
from tests.faults.rows import three_times, until_healthy
from tests.paths import free_port
from tests.waiting import until


async def test_redis_killed_frozen_and_restarted_costs_hits_never_answers() -> None:
    port = free_port()
    async with AsyncExitStack() as stack:
        backend = await stack.enter_async_context(procs.misbehaving("ok", "good"))
        redis = await stack.enter_async_context(procs.redis(port))
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [backend], cache={"enabled": True, "store": "redis", "redis_url": redis.url,
                              "timeout_s": 0.25})))
        await until_healthy(gateway, "b0")
        repeated = chat_body(stream=False, temperature=0, text="the same question")

        async def hit() -> bool:
            async with aiohttp.ClientSession() as http:
                answer = await send(http, gateway.url, repeated)
            assert answer.kind == "ok", answer
            return answer.headers.get("x-kvgate-cache") == "exact"

        async def traffic() -> list[Answer]:
            answers = await send_many(gateway.url, [
                chat_body(stream=i % 2 == 0, temperature=0, text=f"question {i % 5}")
                for i in range(20)], deadline_s=30)
            assert_none_lost(answers)
            assert all(a.kind == "ok" for a in answers), [a.why for a in answers]
            return answers

        async def row() -> None:
            nonlocal redis
            await until(hit, "a repeated question answered from Redis")
            await traffic()
            redis.kill()
            await redis.wait()
            await traffic()  # answered, the store gone
            redis = await stack.enter_async_context(procs.redis(port))
            await until(hit, "hits again once Redis is back on its address", 30)
            redis.freeze()
            try:
                await traffic()  # answered, the store hanging
            finally:
                redis.thaw()
            await until(hit, "hits again once Redis thaws", 30)

        await three_times(gateway, row)
