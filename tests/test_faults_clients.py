"""Fault rows: clients that misbehave or overwhelm the gateway, and the gateway's own shutdown.
Overload with clients hanging up while queued; slow-loris heads and bodies with 2,000 idle
connections while normal traffic runs; a 30 MB valid body while 20 streams run; SIGTERM with 50
streams running. Each asserts that no request is lost and the promised statuses and headers,
and (tests/faults/rows.py) descriptors and memory back where they were."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from contextlib import AsyncExitStack

import aiohttp
import orjson

from tests.faults import procs
from tests.faults.clients import (
    MODEL,
    Answer,
    assert_none_lost,
    chat_body,
    get_json,
    send,
    send_many,
)
from tests.faults.rows import backend_rows, three_times, until_healthy
from tests.waiting import until

CLIENT_TIMEOUTS = {"client_header_timeout_s": 2, "client_body_timeout_s": 2,
                   "keepalive_timeout_s": 2}
CLOSED_WITHIN_S = 15.0  # generous: the timeouts are 2 s


async def test_5x_overload_with_clients_hanging_up_while_queued_loses_nothing() -> None:
    async with AsyncExitStack() as stack:
        small = await stack.enter_async_context(procs.sim(num_gpu_blocks=400, time_scale=5))
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [small], routing={"poll_interval_s": 0.1, "queue": {"timeout_s": 20}})))
        await until_healthy(gateway, "b0")
        long_prompt = "word " * 1500  # ~100 blocks each: four fit, twenty wait

        async def row() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                bodies = [chat_body(max_tokens=32, text=f"{i} {long_prompt}", ignore_eos=True)
                          for i in range(20)]
                patient = [asyncio.ensure_future(send(http, gateway.url, b, deadline_s=60))
                           for b in bodies[::2]]
                hasty = [asyncio.ensure_future(send(http, gateway.url, b)) for b in bodies[1::2]]
                await asyncio.sleep(0.5)  # a client's own patience, not a wait for state
                for task in hasty:
                    task.cancel()
                answers: list[Answer] = list(await asyncio.gather(*patient))
                await asyncio.gather(*hasty, return_exceptions=True)
            kinds = assert_none_lost(answers)
            for answer in answers:
                assert answer.kind == "ok" or answer.status in (429, 503), answer
                if answer.status in (429, 503):
                    assert "retry-after" in answer.headers, answer.headers
            assert kinds["ok"] >= 1, kinds

            async def drained() -> bool:
                row_b0 = (await backend_rows(gateway))["b0"]
                return row_b0["inflight"] == 0 and row_b0["running"] in (0, None)
            await until(drained, "nothing left in flight once every client is gone", 60)
            after = await send_many(gateway.url, [chat_body()] * 5)
            assert all(a.kind == "ok" for a in after), [a.why for a in after]

        await three_times(gateway, row)


async def _slow_client(port: int, head: bytes, drip: bytes) -> bool:
    """Sends `head`, then `drip` a byte every 0.3 s; True when the gateway closed the connection
    (EOF, a reset or a 408) within CLOSED_WITHIN_S."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True  # refused: the cap on connections at work
    try:
        writer.write(head)
        async with asyncio.timeout(CLOSED_WITHIN_S):
            for byte in drip * 100:
                writer.write(bytes([byte]))
                await writer.drain()
                try:
                    await asyncio.wait_for(reader.read(1024), 0.3)
                except TimeoutError:
                    continue
                return True  # EOF, or an answer (a 408): the gateway did not wait for more
        return False
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _idle_client(port: int) -> bool:
    """Connects and sends nothing; True when the gateway closed (or refused) it within
    CLOSED_WITHIN_S, connecting included (past the listen backlog a connect may wait)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(CLOSED_WITHIN_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.read(1024)
        return True
    except TimeoutError:
        return False
    except OSError:
        return True
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def test_slow_loris_and_2000_idle_connections_are_cut_while_normal_traffic_runs() -> None:
    async with AsyncExitStack() as stack:
        backend = await stack.enter_async_context(procs.misbehaving("ok", "good"))
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [backend], server=CLIENT_TIMEOUTS)))
        await until_healthy(gateway, "b0")
        heads = b"POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\n"
        body_head = (heads + b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n")

        async def row() -> None:
            idle = [asyncio.ensure_future(_idle_client(gateway.port)) for _ in range(2000)]
            loris = [asyncio.ensure_future(_slow_client(gateway.port, heads, b"X-Slow: abcdef"))
                     for _ in range(50)]
            bodies = [asyncio.ensure_future(_slow_client(gateway.port, body_head, b'{"model"'))
                      for _ in range(50)]
            normal = await send_many(gateway.url, [chat_body(stream=i % 2 == 0)
                                                   for i in range(50)], deadline_s=30)
            assert all(a.kind == "ok" for a in normal), [a.why for a in normal if a.kind != "ok"]
            assert all(await asyncio.gather(*loris)), "a slow-loris head was never cut"
            assert all(await asyncio.gather(*bodies)), "a slow-loris body was never cut"
            assert all(await asyncio.gather(*idle)), "an idle connection was never closed"

        await three_times(gateway, row)


def thirty_mb_body() -> bytes:
    """A valid 30 MB chat: 10,000 messages (server.max_messages) of an image each, so the
    prompt's text (what admission prices) stays short while the body is parsed whole."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 3000}}
    question = {"role": "user", "content": "what do these show?"}
    return orjson.dumps({"model": MODEL, "max_tokens": 4, "messages": [question] + [
        {"role": "user", "content": [image]} for _ in range(9_999)]})


async def test_a_30_mb_valid_body_is_answered_while_20_streams_run() -> None:
    async with AsyncExitStack() as stack:
        backend = await stack.enter_async_context(procs.misbehaving("endless", "good"))
        gateway = await stack.enter_async_context(procs.gateway(procs.gateway_config(
            [backend], server={"stream_idle_timeout_s": 30, "first_byte_timeout_s": 30})))
        await until_healthy(gateway, "b0")
        big = thirty_mb_body()
        assert len(big) > 30_000_000

        async def row() -> None:
            begun = asyncio.Event()
            count = 0

            def first() -> None:
                nonlocal count
                count += 1
                if count == 20:
                    begun.set()

            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                streams = [asyncio.ensure_future(send(http, gateway.url, chat_body(
                    max_tokens=150), on_first=first)) for _ in range(20)]
                await asyncio.wait_for(begun.wait(), 30)
                answer = await send(http, gateway.url, big, deadline_s=60)
                answers = list(await asyncio.gather(*streams))
            assert answer.kind == "ok", answer
            assert_none_lost(answers)
            assert all(a.kind == "ok" for a in answers), [a.why for a in answers]

        await three_times(gateway, row, rss_slack_kib=3 * len(big) // 1024)


async def ready_is_503(url: str) -> bool:
    status, _ = await get_json(url, "/ready")
    return status == 503


async def test_sigterm_with_50_streams_drains_them_and_exits_0() -> None:
    async with AsyncExitStack() as stack:
        backend = await stack.enter_async_context(procs.misbehaving("endless", "good"))
        config = procs.gateway_config([backend], server={
            "drain_grace_s": 1, "shutdown_timeout_s": 2, "stream_idle_timeout_s": 30})
        gateway = await stack.enter_async_context(procs.gateway(config))
        await until_healthy(gateway, "b0")
        begun = asyncio.Event()
        count = 0

        def first() -> None:
            nonlocal count
            count += 1
            if count == 50:
                begun.set()

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            streams = [asyncio.ensure_future(send(http, gateway.url, chat_body(
                max_tokens=100_000), on_first=first, deadline_s=30)) for _ in range(50)]
            await asyncio.wait_for(begun.wait(), 30)
            gateway.signal(signal.SIGTERM)
            # The signal reaches the gateway's loop in its own time: the first read of /ready
            # may precede it, so wait (well within drain_grace_s) for it to turn.
            await until(lambda: ready_is_503(gateway.url), "/ready answers 503 once draining",
                        timeout_s=5)
            late = await send(http, gateway.url, chat_body(stream=False), deadline_s=10)
            answers = list(await asyncio.gather(*streams))
        assert late.status == 503 and "retry-after" in late.headers, late
        assert_none_lost(answers)
        assert all(a.kind == "error" for a in answers), [a.why for a in answers]
        assert await gateway.wait(15) == 0, gateway.output()
