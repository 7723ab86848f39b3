"""Health from requests' outcomes, metrics freshness apart, end to end: the gateway with its
poller in front of loopback backends that misbehave on command.

- A backend whose /metrics is missing, garbage or hangs but whose chat works stays in rotation
  and gets traffic, shown `stale` (never scraped) in /admin/backends.
- A backend answering 500 to every request while its /metrics look fine is ejected after
  `health.consecutive_failures` of them, and the traffic goes to the other; /admin/backends and
  /metrics show the ejection and its reason.
- With every backend refusing connections, a request gets 503 `no_healthy_backend` with
  Retry-After at once (no wait for the queue timeout) and /ready is 503; once a backend listens
  again, the poller's scrape brings it back without a restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.config import Settings
from gateway.serve import running_gateway
from tests.paths import FIXTURES, free_port
from tests.waiting import until

MODEL = "m"
LABELS = b'{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
RUNNING = b"vllm:num_requests_running" + LABELS
WAITING = b"vllm:num_requests_waiting" + LABELS
FIXTURE = (FIXTURES / "vllm-v1.prom").read_bytes()
assert RUNNING + b" 24.0" in FIXTURE and WAITING + b" 3.0" in FIXTURE
ANSWER = {"object": "chat.completion", "model": MODEL, "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
CHAT = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "hello"}]}


class Backend:
    """A loopback backend: `metrics` is ok | missing (404) | garbage | hang; `chat` is ok | 500.
    Its /metrics report the chats it is answering as running; each takes `answer_s`."""

    def __init__(self, metrics: str = "ok", chat: str = "ok", answer_s: float = 0.0) -> None:
        self.metrics, self.chat, self.answer_s = metrics, chat, answer_s
        self.calls = self.running = 0
        self._release = asyncio.Event()

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics == "missing":
            return web.Response(status=404, text="404: Not Found")
        if self.metrics == "garbage":
            return web.Response(body=b"\x89PNG not metrics \xff", content_type="text/plain")
        if self.metrics == "hang":
            await self._release.wait()
        body = FIXTURE.replace(RUNNING + b" 24.0", RUNNING + b" %d" % self.running).replace(
            WAITING + b" 3.0", WAITING + b" 0")
        return web.Response(body=body, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _complete(self, request: web.Request) -> web.Response:
        self.calls += 1
        await request.read()
        if self.chat == "500":
            return web.json_response({"error": {"message": "CUDA error"}}, status=500)
        self.running += 1
        try:
            await asyncio.sleep(self.answer_s)  # a generation's time, not a wait for state
        finally:
            self.running -= 1
        return web.json_response(ANSWER)

    @asynccontextmanager
    async def serving(self, port: int = 0) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._complete)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            self._release.set()
            await runner.cleanup()


def settings(urls: dict[str, str], policy: str, **sections: Any) -> Settings:
    return Settings.model_validate({
        "server": {"port": 0},
        "backends": [{"url": url, "id": name, "models": [MODEL]} for name, url in urls.items()],
        "routing": {"policy": policy, "poll_interval_s": 0.02, "scrape_timeout_s": 0.2,
                    "seed": 7},
        **sections,
    })


async def rows(http: aiohttp.ClientSession, gateway: str) -> dict[str, dict[str, Any]]:
    async with http.get(gateway + "/admin/backends") as resp:
        return {row["id"]: row for row in orjson.loads(await resp.read())["backends"]}


async def chat(http: aiohttp.ClientSession, gateway: str) -> tuple[int, str | None]:
    async with http.post(gateway + "/v1/chat/completions", json=CHAT) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-kvgate-backend")


@pytest.mark.parametrize("metrics", ["missing", "garbage", "hang"])
@pytest.mark.parametrize("policy", ["cost", "kv_util", "least_request"])
async def test_a_backend_whose_metrics_fail_but_whose_chat_works_gets_traffic(
    metrics: str, policy: str,
) -> None:
    fresh, blind = Backend(answer_s=0.05), Backend(metrics=metrics, answer_s=0.05)
    async with AsyncExitStack() as stack:
        urls = {"fresh": await stack.enter_async_context(fresh.serving()),
                "blind": await stack.enter_async_context(blind.serving())}
        gateway = await stack.enter_async_context(running_gateway(settings(urls, policy)))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        await until(lambda: _scraped(http, gateway), "the fresh backend scraped")

        async def burst() -> list[tuple[int, str | None]]:
            return list(await asyncio.gather(*(chat(http, gateway) for _ in range(8))))

        answers = [a for _ in range(5) for a in await burst()]
        assert {status for status, _ in answers} == {200}
        assert blind.calls > 0 and fresh.calls > 0, (blind.calls, fresh.calls)
        row = (await rows(http, gateway))["blind"]
        assert (row["healthy"], row["stale"], row["last_poll_age_ms"]) == (True, True, None)
        if metrics != "hang":
            assert row["scrape_failures"] > 0


async def _scraped(http: aiohttp.ClientSession, gateway: str) -> bool:
    return (await rows(http, gateway))["fresh"]["kv_total_blocks"] is not None


async def test_a_backend_answering_500_with_good_metrics_is_ejected_and_the_other_takes_over(
) -> None:
    good, bad = Backend(), Backend(chat="500")
    async with AsyncExitStack() as stack:
        urls = {"good": await stack.enter_async_context(good.serving()),
                "bad": await stack.enter_async_context(bad.serving())}
        health = {"consecutive_failures": 5, "base_ejection_s": 60.0,
                  "max_ejected_fraction": 0.5}
        gateway = await stack.enter_async_context(
            running_gateway(settings(urls, "round_robin", health=health)))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        await until(lambda: _scraped_all(http, gateway), "both backends scraped")
        answers = [await chat(http, gateway) for _ in range(30)]
        assert bad.calls == 5, "ejected after exactly five failures in a row"
        assert [backend for _, backend in answers[-10:]] == ["good"] * 10
        assert all(status == 200 for status, _ in answers[-10:])
        row = (await rows(http, gateway))["bad"]
        assert (row["healthy"], row["ejections"], row["consecutive_failures"]) == (False, 1, 5)
        assert 0 < row["ejected_until"] <= 60.0 and row["stale"] is False
        async with http.get(gateway + "/metrics") as resp:
            text = await resp.text()
        assert ('kvgate_backend_ejections_total{kvgate_backend="bad",'
                'kvgate_ejection_reason="status_5xx"} 1') in text
        assert 'kvgate_backend_ejected{kvgate_backend="bad"} 1' in text
        assert 'kvgate_backend_ejected{kvgate_backend="good"} 0' in text


async def _scraped_all(http: aiohttp.ClientSession, gateway: str) -> bool:
    return all(row["kv_total_blocks"] is not None for row in (await rows(http, gateway)).values())


async def test_with_every_backend_refusing_a_request_gets_503_with_retry_after_at_once() -> None:
    port = free_port()
    urls = {"down": f"http://127.0.0.1:{port}"}
    async with (running_gateway(settings(urls, "cost")) as gateway,  # queue timeout: 30 s
                aiohttp.ClientSession() as http):
        async with http.get(gateway + "/ready") as resp:
            assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1
        started = time.monotonic()
        async with http.post(gateway + "/v1/chat/completions", json=CHAT) as resp:
            body = orjson.loads(await resp.read())
            assert (resp.status, body["error"]["code"]) == (503, "no_healthy_backend")
            assert int(resp.headers["Retry-After"]) >= 1
        assert time.monotonic() - started < 10.0, "answered at once, not after the queue timeout"
        assert (await rows(http, gateway))["down"]["reachable"] is False

        async with Backend().serving(port=port):
            async def ready() -> bool:
                async with http.get(gateway + "/ready") as resp:
                    return resp.status == 200

            await until(ready, "the backend back in rotation once it answers a scrape")
            assert await chat(http, gateway) == (200, "down")
