"""What a client gets when a backend answers an error, and what the gateway sends a backend:
errors before the first byte are tried once elsewhere within the retry budget and counted, the
last one is relayed with its status, its Retry-After and its message in OpenAI's shape; every 503
of the gateway's own carries Retry-After; a backend's own API key goes upstream, the client's
never does."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from gateway.proxy import Outcome
from tests.upstreams import (
    GOOD_JSON,
    admin_rows,
    chat,
    gateway_over,
    metric_lines,
    no_inflight,
    post,
)
from tests.waiting import until

LLAMACPP_ERROR = (b'{"error":{"code":503,"message":"Loading model","type":'
                  b'"unavailable_error"}}')
TGI_ERROR = b'{"error":"Model is overloaded","error_type":"overloaded"}'


@pytest.mark.parametrize(("status", "reason"), [
    (500, "status_5xx"), (502, "status_5xx"), (503, "status_5xx"), (429, "status_429"),
], ids=["500", "502", "503", "429"])
async def test_an_error_before_the_first_byte_is_served_by_the_other_backend_and_counted(
    status: int, reason: str
) -> None:
    outcomes: list[Outcome] = []
    async with gateway_over(2, on_done=outcomes.append) as (url, (bad, good), client):
        bad.mode, bad.status, bad.error_body = "status", status, TGI_ERROR
        while not any(o.attempts == 2 for o in outcomes):
            assert len(outcomes) < 2, "the failing backend was never tried"
            answer, body, headers = await post(client, url, chat(False))
            assert (answer, headers["x-kvgate-backend"]) == (200, "u1")
            assert orjson.loads(body) == GOOD_JSON
        assert bad.calls == 1
        retries = await metric_lines(client, url, "kvgate_retries_total")
        assert retries == {f'{{reason="{reason}"}}': 1.0}
        await until(lambda: no_inflight(client, url), "in-flight counts back to zero")


async def test_a_429_with_no_other_backend_reaches_the_client_with_its_retry_after() -> None:
    """Only Retry-After of the backend's headers is relayed (never its hop-by-hop ones), and
    its message is kept in OpenAI's shape."""
    async with gateway_over(1) as (url, (upstream,), client):
        upstream.mode, upstream.status, upstream.error_body = "status", 429, TGI_ERROR
        upstream.error_headers = {"Retry-After": "7", "Keep-Alive": "timeout=5",
                                  "X-Internal": "secret", "Content-Type": "application/json"}
        status, body, headers = await post(client, url, chat(True))
        assert status == 429
        assert headers["Retry-After"] == "7"
        assert "X-Internal" not in headers and "Keep-Alive" not in headers
        assert headers["Content-Type"].startswith("application/json")
        assert orjson.loads(body) == {"error": {
            "message": "Model is overloaded", "type": "rate_limit_error", "param": None,
            "code": None}}
        assert upstream.calls == 1


@pytest.mark.parametrize(("payload", "message"), [
    (LLAMACPP_ERROR, "Loading model"),
    (b"upstream connect error or disconnect/reset before headers", "upstream connect error or "
     "disconnect/reset before headers"),
], ids=["llama.cpp's body", "plain text"])
async def test_when_every_backend_fails_the_last_error_is_relayed_with_its_message(
    payload: bytes, message: str
) -> None:
    async with gateway_over(2) as (url, upstreams, client):
        for upstream in upstreams:
            upstream.mode, upstream.status, upstream.error_body = "status", 503, payload
            upstream.error_headers = {"Content-Type": "text/plain"}
        status, body, headers = await post(client, url, chat(False))
        assert status == 503
        assert headers["Content-Type"].startswith("application/json")
        assert orjson.loads(body)["error"]["message"] == message
        assert sum(u.calls for u in upstreams) == 2  # one try each, no more


async def test_no_healthy_backend_is_a_503_with_retry_after() -> None:
    async with gateway_over(1) as (url, (upstream,), client):
        await upstream.stop()  # refuses connections: the attempt finds it unreachable
        await post(client, url, chat(False))
        await until(lambda: _unhealthy(client, url), "the refusing backend marked down")
        status, body, headers = await post(client, url, chat(False))
        assert status == 503
        assert orjson.loads(body)["error"]["code"] == "no_healthy_backend"
        assert int(headers["Retry-After"]) >= 1


async def _unhealthy(client: aiohttp.ClientSession, url: str) -> bool:
    status, _, _ = await post(client, url, chat(False))
    return status == 503


@pytest.mark.parametrize("in_flight", [10, 20], ids=["10 in flight", "20 in flight"])
async def test_the_retry_budget_retries_at_most_a_fifth_of_the_requests_in_flight_or_3(
    in_flight: int,
) -> None:
    """Every request is held by its first backend until all are in flight; then one backend
    answers 500 to each of its own. Only max(3, 20%) of them are tried on the other, which holds
    them until the others got their 500."""
    limit = max(3, in_flight // 5)
    async with gateway_over(2) as (url, (failing, holding), client):
        failing.mode, holding.mode = "hold", "hold"
        requests = [asyncio.create_task(post(client, url, chat(False)))
                    for _ in range(in_flight)]
        await until(lambda: failing.calls + holding.calls == in_flight, "every request placed")
        failed_first = failing.calls
        assert failed_first > limit, "round robin gave the failing backend too few"
        failing.mode, failing.status = "status", 500
        failing.error_body = b'{"error":{"message":"boom","type":"server_error"}}'
        failing.release.set()
        await until(lambda: holding.calls == in_flight - failed_first + limit,
                    "the retries within the budget placed")
        await until(lambda: sum(t.done() for t in requests) == failed_first - limit,
                    "the failures beyond the budget answered")
        holding.release.set()
        statuses = sorted(status for status, _, _ in await asyncio.gather(*requests))
        assert statuses == [200] * (in_flight - failed_first + limit) + \
            [500] * (failed_first - limit)
        assert await metric_lines(client, url, "kvgate_retries_total") == {
            '{reason="status_5xx"}': limit}
        assert await metric_lines(client, url, "kvgate_retry_budget_exhausted_total") == {
            "": failed_first - limit}


async def test_a_backend_gets_its_own_api_key_and_never_the_clients() -> None:
    async with gateway_over(2, backends=[{"api_key": "backend-secret"}, {}]) as (
            url, (keyed, plain), client):
        await until(lambda: "/metrics" in keyed.paths, "the first scrape of the keyed backend")
        for _ in range(2):  # round robin: one each
            status, _, _ = await post(client, url, chat(False), headers={
                "Authorization": "Bearer client-secret", "api-key": "client-secret"})
            assert status == 200
        assert (keyed.calls, plain.calls) == (1, 1)
        assert {*keyed.paths} >= {"/v1/models", "/metrics", "/v1/chat/completions"}
        for seen in keyed.headers:  # discovery, scrapes and the request alike
            assert seen.get("Authorization") == "Bearer backend-secret"
        for seen in [*keyed.headers, *plain.headers]:
            assert "client-secret" not in " ".join(seen.values())
            assert "api-key" not in {name.lower() for name in seen}
        assert all("Authorization" not in seen for seen in plain.headers)
        rows = await admin_rows(client, url)
        assert "backend-secret" not in orjson.dumps(rows).decode()


@pytest.mark.parametrize("through", ["keep-alive client", "aiohttp session"])
async def test_both_scrape_clients_send_the_backends_key(through: str) -> None:
    from routing.scrape_client import get
    from routing.scrape_session import client_for
    from tests.upstreams import FaultyUpstream

    upstream = FaultyUpstream()
    await upstream.start()
    try:
        async with aiohttp.ClientSession() as session:
            scraper = client_for(upstream.url, session if through == "aiohttp session" else None,
                                 api_key="backend-secret")
            assert scraper is not None
            await get(scraper, "/metrics", 5.0)
            await scraper.close()
    finally:
        await upstream.stop()
    assert upstream.headers[0]["Authorization"] == "Bearer backend-secret"


def test_a_backend_key_stays_out_of_the_settings_repr() -> None:
    from gateway.config import Settings

    settings = Settings.model_validate({"backends": [{"url": "http://127.0.0.1:9",
                                                      "api_key": "backend-secret"}]})
    assert "backend-secret" not in repr(settings)
    assert "backend-secret" not in repr(settings.backend_specs())
    assert settings.backend_specs()[0].api_key == "backend-secret"


def test_a_backend_key_comes_from_the_environment_like_every_field() -> None:
    from gateway.config import load_settings

    settings = load_settings(environ={"KVGATE_BACKENDS__0__URL": "http://127.0.0.1:9",
                                      "KVGATE_BACKENDS__0__API_KEY": "from-env"})
    assert settings.backend_specs()[0].api_key == "from-env"


@pytest.mark.parametrize("key", ["", "two words", "line\r\nX-Injected: 1", "caf\u00e9"],
                         ids=["empty", "a space", "a header injected", "not ASCII"])
def test_a_backend_key_that_cannot_be_a_header_is_refused_without_echoing_it(key: str) -> None:
    from gateway.config import ConfigError, load_settings

    with pytest.raises(ConfigError) as refused:
        load_settings(environ={"KVGATE_BACKENDS__0__URL": "http://127.0.0.1:9",
                               "KVGATE_BACKENDS__0__API_KEY": key})
    assert "KVGATE_BACKENDS__0__API_KEY" in str(refused.value)
    assert not key or key not in str(refused.value)
