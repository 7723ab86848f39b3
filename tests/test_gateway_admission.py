"""The gateway queue over HTTP, against a real simulator on loopback whose KV cache holds one
large request at a time: requests that do not fit wait at the gateway; a full queue answers 429
with Retry-After at once; a wait past the queue timeout answers 503 with Retry-After; a queued
request leaves as soon as capacity frees; a client that hangs up while queued is never sent on;
past the TPOT SLO, what no backend can take within it answers 429 over_slo, unless its
priority class is exempt.
Also who is asking (tenant, priority, session) and what the model reads, as tables."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings
from gateway.errors import InvalidRequest
from gateway.exchange import priority_of, prompt_of, tenant_of
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from routing.dispatch import DEFAULT_TENANT
from routing.prefix import conversation_text

MODEL = PRESETS[DEFAULT_PRESET].model_name
DEADLINE_S = 10.0
# ~1,000 estimated prompt tokens and up to 400 more: ~77 of the simulator's 100 blocks at the
# expected peak, so a second one does not fit under the 90-block high-water mark.
BIG = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 800}],
       "max_tokens": 400, "ignore_eos": True}


def big(tag: str, **extra: Any) -> dict[str, Any]:
    return {**BIG, "messages": [{"role": "user", "content": f"{tag} " + "word " * 800}], **extra}


@asynccontextmanager
async def rig(**queue: Any) -> AsyncIterator[tuple[str, str, aiohttp.ClientSession]]:
    async with running_sim(time_scale=1.0, num_gpu_blocks=100) as sim:
        settings = Settings.model_validate({
            "server": {"port": 0},
            "backends": [{"url": sim}],
            "routing": {"poll_interval_s": 0.05, "queue": queue},
        })
        async with running_gateway(settings) as gateway, aiohttp.ClientSession() as http:
            yield gateway, sim, http


async def wait_for(check: Callable[[], Awaitable[bool]], what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE_S
    while not await check():
        assert loop.time() < end, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.01)


async def sim_figures(http: aiohttp.ClientSession, sim: str) -> dict[str, float]:
    """Running requests and finished ones (any reason) in the simulator."""
    async with http.get(sim + "/metrics") as resp:
        text = await resp.text()
    out = {"running": 0.0, "finished": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_running":
                out["running"] += sample.value
            elif sample.name == "vllm:request_success_total":
                out["finished"] += sample.value
    return out


async def queue_depth(http: aiohttp.ClientSession, gateway: str) -> float:
    """The gateway's own count of requests waiting in its queue."""
    async with http.get(gateway + "/metrics") as resp:
        text = await resp.text()
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples if sample.name == "kvgate_queue_depth")


async def until_queued(http: aiohttp.ClientSession, gateway: str, depth: int = 1) -> None:
    async def queued() -> bool:
        return await queue_depth(http, gateway) == depth

    await wait_for(queued, f"{depth} request(s) waiting in the gateway queue")


async def scrapes(http: aiohttp.ClientSession, gateway: str, count: int) -> None:
    """Returns after the gateway has scraped its backend `count` more times."""
    async def poll_age_ms() -> float:
        async with http.get(gateway + "/admin/backends") as resp:
            return float(orjson.loads(await resp.read())["backends"][0]["last_poll_age_ms"])

    seen, last = 0, await poll_age_ms()

    async def scraped() -> bool:
        nonlocal seen, last
        age = await poll_age_ms()
        seen, last = seen + (age < last), age
        return seen >= count

    await wait_for(scraped, f"{count} scrapes of the backend")


async def hold_a_big_request(gateway: str, http: aiohttp.ClientSession,
                             sim: str) -> aiohttp.ClientResponse:
    """A streamed big request, running in the simulator, held open by the caller."""
    resp = await http.post(gateway + "/v1/chat/completions", json=big("hold", stream=True))
    assert resp.status == 200 and admission_wait_ms(resp.headers) == 0.0

    async def running() -> bool:
        return (await sim_figures(http, sim))["running"] == 1

    await wait_for(running, "the held request runs in the simulator")
    return resp


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any], Any]:
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, orjson.loads(await resp.read()), resp.headers


async def test_a_request_that_fits_nowhere_waits_and_leaves_the_queue_when_capacity_frees(
) -> None:
    async with rig() as (gateway, sim, http):
        held = await hold_a_big_request(gateway, http, sim)
        waiting = asyncio.create_task(post(http, gateway, big("second", max_tokens=8)))
        await until_queued(http, gateway)
        queued_at = asyncio.get_running_loop().time()
        await scrapes(http, gateway, 3)  # several scrapes: it still does not fit
        assert not waiting.done()
        assert (await sim_figures(http, sim))["running"] == 1
        held_ms = (asyncio.get_running_loop().time() - queued_at) * 1000.0
        held.close()  # the big request ends: its KV frees
        status, body, headers = await waiting
        assert status == 200 and body["usage"]["completion_tokens"] == 8
        assert float(headers["x-kvgate-queue-ms"]) >= held_ms
        assert "admission=queued" in headers["x-kvgate-route"]


async def test_a_full_queue_answers_429_at_once_with_retry_after() -> None:
    async with rig(max_depth=1) as (gateway, sim, http):
        held = await hold_a_big_request(gateway, http, sim)
        queued = asyncio.create_task(post(http, gateway, big("queued")))
        await until_queued(http, gateway)
        status, body, headers = await post(http, gateway, big("overflow"))
        assert status == 429
        assert body["error"]["code"] == "queue_full"
        assert int(headers["Retry-After"]) >= 1
        assert not queued.done()
        held.close()
        assert (await queued)[0] == 200


async def test_a_wait_past_the_queue_timeout_answers_503_with_retry_after() -> None:
    async with rig(timeout_s=0.4) as (gateway, sim, http):
        held = await hold_a_big_request(gateway, http, sim)
        status, body, headers = await post(http, gateway, big("late"))
        assert status == 503
        assert body["error"]["code"] == "queue_timeout"
        assert int(headers["Retry-After"]) >= 1
        assert float(headers["x-kvgate-queue-ms"]) >= 400.0
        held.close()


async def test_a_client_that_hangs_up_while_queued_is_never_sent_to_a_backend() -> None:
    async with rig() as (gateway, sim, http):
        held = await hold_a_big_request(gateway, http, sim)
        gone = asyncio.create_task(post(http, gateway, big("gone")))
        await until_queued(http, gateway)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        held.close()

        async def blocker_finished() -> bool:
            return (await sim_figures(http, sim)) == {"running": 0.0, "finished": 1.0}

        await wait_for(blocker_finished, "the held request ends in the simulator")
        status, _, _ = await post(http, gateway, big("probe", max_tokens=4))
        assert status == 200
        # The probe is the only other request the simulator ever saw.
        assert await sim_figures(http, sim) == {"running": 0.0, "finished": 2.0}


@asynccontextmanager
async def slo_rig(**slo: Any) -> AsyncIterator[tuple[str, str, aiohttp.ClientSession]]:
    """A gateway with the strictest TPOT SLO in front of one simulator, after one streamed
    request: its first token and its TPOT are the backend's first speed readings (the gate
    waits for them). A backend is then held to twice its own idle TPOT, which it passes once
    prefill takes over half its time."""
    async with running_sim(time_scale=1.0) as sim:
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": sim}],
            "routing": {"poll_interval_s": 0.05}, "slo": {"tpot_s": 0.001, **slo},
        })
        async with running_gateway(settings) as gateway, aiohttp.ClientSession() as http:
            async with http.post(gateway + "/v1/chat/completions",
                                 json=big("warm", max_tokens=8, stream=True)) as resp:
                assert resp.status == 200
                await resp.read()
            yield gateway, sim, http


def long_prompt(tag: str) -> dict[str, Any]:
    """~4,700 tokens: each one's prefill stretches the decode steps of the replies there."""
    return {"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": f"{tag} " + "word " * 4000}]}


async def test_past_the_tpot_slo_the_excess_is_refused_429_over_slo_and_never_sent_on(
) -> None:
    # 20 distinct long prompts at once: the predicted TPOT passes the SLO after some; the rest
    # are refused at once.
    async with slo_rig() as (gateway, sim, http):
        answers = await asyncio.gather(*(post(http, gateway, long_prompt(str(i)))
                                         for i in range(20)))
        statuses = [status for status, _, _ in answers]
        assert 200 in statuses and 429 in statuses, statuses
        for status, body, headers in answers:
            if status == 429:
                assert body["error"]["code"] == "over_slo"
                assert body["error"]["type"] == "rate_limit_error"
                assert int(headers["Retry-After"]) >= 1
            else:
                assert status == 200

        async def served() -> bool:
            return (await sim_figures(http, sim))["finished"] == 1 + statuses.count(200)

        await wait_for(served, "the simulator finished exactly the admitted requests")
        assert (await sim_figures(http, sim))["running"] == 0.0


async def test_past_the_tpot_slo_a_class_at_or_above_slo_exempt_priority_is_still_served(
) -> None:
    # The same burst of class 0, then class 1 (exempt): class 0 is shed, class 1 all served.
    async with slo_rig(exempt_priority=1) as (gateway, _, http):
        free = [post(http, gateway, long_prompt(f"free {i}")) for i in range(20)]
        paid = [post(http, gateway, long_prompt(f"paid {i}"), {"x-kvgate-priority": "1"})
                for i in range(6)]
        answers = await asyncio.gather(*free, *paid)
        free_statuses = [status for status, _, _ in answers[:20]]
        assert 429 in free_statuses, free_statuses
        assert [status for status, _, _ in answers[20:]] == [200] * 6


def admission_wait_ms(headers: Mapping[str, str]) -> float:
    """The `queue` part of server-timing: the wait in the admission queue alone, as
    x-kvgate-queue-ms says it too."""
    parts = dict(p.strip().split(";dur=") for p in headers["server-timing"].split(","))
    return float(parts["queue"])


async def test_a_request_not_queued_reports_a_zero_wait_and_its_route() -> None:
    async with rig() as (gateway, _, http):
        status, _, headers = await post(http, gateway, big("alone", max_tokens=4))
        assert status == 200
        assert admission_wait_ms(headers) == 0.0
        assert 0.0 <= float(headers["x-kvgate-queue-ms"])
        route = headers["x-kvgate-route"]
        assert route.startswith("policy=cost; ttft_ms=") and "admission=admitted" in route


async def test_a_bad_priority_header_is_a_400_naming_it() -> None:
    async with rig() as (gateway, _, http):
        status, body, _ = await post(http, gateway, big("x"), {"x-kvgate-priority": "high"})
        assert status == 400 and body["error"]["param"] == "x-kvgate-priority"


# Who is asking.

@pytest.mark.parametrize(
    ("headers", "tenant"),
    [({"x-kvgate-tenant": "team-a"}, "team-a"),
     ({"x-kvgate-tenant": "team-a", "Authorization": "Bearer sk-1"}, "team-a"),
     ({"Authorization": "Bearer sk-1"}, "key-"),
     ({"Authorization": "Basic abc"}, DEFAULT_TENANT),
     ({}, DEFAULT_TENANT)],
    ids=["the tenant header names the tenant", "the tenant header wins over a key",
         "a bearer token is a tenant by its hash", "other schemes are anonymous",
         "nothing at all is anonymous"],
)
def test_tenant(headers: dict[str, str], tenant: str) -> None:
    got = tenant_of(CIMultiDict(headers), "x-kvgate-tenant")
    assert got.startswith(tenant)
    assert "sk-1" not in got  # the token itself never becomes a label


def test_two_keys_are_two_tenants_and_one_key_is_one() -> None:
    def of(key: str) -> str:
        return tenant_of(CIMultiDict({"Authorization": f"Bearer {key}"}), "x-kvgate-tenant")

    assert of("sk-1") == of("sk-1") != of("sk-2")


@pytest.mark.parametrize(("value", "priority"), [(None, 0), ("5", 5), (" -2 ", -2), ("", 0)],
                         ids=["absent is class 0", "a number is its class",
                              "negative classes go last", "empty is class 0"])
def test_priority(value: str | None, priority: int) -> None:
    headers = CIMultiDict({} if value is None else {"x-kvgate-priority": value})
    assert priority_of(headers, "x-kvgate-priority") == priority


@pytest.mark.parametrize("value", ["high", "1e3", "99999999999"])
def test_a_priority_that_is_not_a_sane_integer_is_rejected(value: str) -> None:
    with pytest.raises(InvalidRequest):
        priority_of(CIMultiDict({"x-kvgate-priority": value}), "x-kvgate-priority")


@pytest.mark.parametrize(
    ("body", "text", "exact"),
    [({"messages": [{"role": "user", "content": "hi"}]},
      conversation_text([("user", "hi")]), None),
     ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                 {"type": "image_url", "image_url": {}},
                                                 {"type": "text", "text": "b"}]}]},
      conversation_text([("user", "ab")]), None),
     ({"prompt": "once upon"}, "once upon", None),
     ({"prompt": ["a", "b"]}, "a\nb", None),
     ({"prompt": [1, 2, 3]}, "", 3),
     ({"prompt": [[1, 2], [3]]}, "", 3)],
    ids=["chat: the conversation with its roles", "chat: the text parts of a content list",
         "a prompt string", "a list of prompts", "token ids are an exact count",
         "lists of token ids are an exact count"],
)
def test_what_the_model_reads(body: dict[str, Any], text: str, exact: int | None) -> None:
    assert prompt_of(body) == (text, exact)
