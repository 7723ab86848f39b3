"""API keys, end to end against a simulator on loopback: with `auth.keys` set, every request but
the health probes (and /metrics, unless protected) needs a listed key; the admin views need an
admin key; a request's tenant is its key's. Without keys nothing is asked."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.config import ConfigError, Settings, load_settings
from gateway.proxy import Outcome
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim

MODEL = "llama-3-8b"
USER_KEY = "sk-user-0123456789abcdef"
ADMIN_KEY = "sk-admin-0123456789abcdef"
HASHED_KEY = "sk-hashed-0123456789abcdef"
KEYS = [
    {"name": "alice", "key": USER_KEY, "tenant": "team-a"},
    {"name": "ops", "key": ADMIN_KEY, "admin": True},
    {"name": "bob", "sha256": hashlib.sha256(HASHED_KEY.encode()).hexdigest()},
]
CHAT = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def gateway(auth: dict[str, Any] | None, outcomes: list[Outcome] | None = None,
                  cache: dict[str, Any] | None = None
                  ) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(model=MODEL, time_scale=20.0))
        settings = Settings.model_validate({
            "server": {"port": 0}, "backends": [{"url": sim, "id": "sim0"}],
            "routing": {"poll_interval_s": 0.05},
            **({"auth": auth} if auth is not None else {}),
            **({"cache": cache} if cache is not None else {}),
        })
        sink = outcomes.append if outcomes is not None else None
        url = await stack.enter_async_context(running_gateway(settings, on_done=sink))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield url, http


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def call(http: aiohttp.ClientSession, method: str, url: str,
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    body = CHAT if method == "POST" else None
    async with http.request(method, url, json=body, headers=headers or {}) as resp:
        raw = await resp.read()
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            payload = raw
        return resp.status, dict(resp.headers), payload


async def test_without_keys_configured_no_key_is_asked() -> None:
    async with gateway(None) as (url, http):
        status, _, _ = await call(http, "POST", url + "/v1/chat/completions")
        assert status == 200
        status, _, _ = await call(http, "GET", url + "/admin/backends")
        assert status == 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({}, 401, id="no key: 401"),
        pytest.param(bearer("sk-not-a-key-0123456789"), 401, id="an unknown key: 401"),
        pytest.param({"Authorization": USER_KEY}, 401, id="a key without the Bearer scheme: 401"),
        pytest.param(bearer(USER_KEY), 200, id="a listed key as a bearer token"),
        pytest.param({"api-key": USER_KEY}, 200, id="a listed key in api-key (Azure's header)"),
        pytest.param(bearer(HASHED_KEY), 200, id="a key configured by its sha256"),
    ],
)
async def test_a_completion_needs_a_listed_key(headers: dict[str, str], status: int) -> None:
    async with gateway({"keys": KEYS}) as (url, http):
        got, response_headers, payload = await call(http, "POST", url + "/v1/chat/completions",
                                                    headers)
        assert got == status
        if status == 401:
            assert payload["error"]["code"] == "invalid_api_key"
            assert payload["error"]["type"] == "invalid_request_error"
            assert response_headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        pytest.param("/health", {}, 200, id="health is open"),
        pytest.param("/ready", {}, 200, id="ready is open"),
        pytest.param("/metrics", {}, 200, id="metrics is open by default"),
        pytest.param("/v1/models", {}, 401, id="models needs a key"),
        pytest.param("/v1/models", bearer(USER_KEY), 200, id="models with a key"),
        pytest.param("/admin/backends", {}, 401, id="admin without a key: 401"),
        pytest.param("/admin/backends", bearer(USER_KEY), 403,
                     id="admin with a user key: 403"),
        pytest.param("/admin/backends", bearer(ADMIN_KEY), 200, id="admin with an admin key"),
        pytest.param("/admin/cache", bearer(ADMIN_KEY), 200, id="the cache view too"),
        pytest.param("DELETE /admin/cache", bearer(USER_KEY), 403,
                     id="flushing the cache needs an admin key"),
        pytest.param("DELETE /admin/cache", bearer(ADMIN_KEY), 200, id="which may flush it"),
    ],
)
async def test_what_each_endpoint_asks(path: str, headers: dict[str, str], status: int) -> None:
    method, _, path = path.rpartition(" ")
    async with gateway({"keys": KEYS}) as (url, http):
        got, _, payload = await call(http, method or "GET", url + path, headers)
        assert got == status
        if status == 403:
            assert payload["error"]["code"] == "permission_denied"


async def test_protected_metrics_need_a_key() -> None:
    async with gateway({"keys": KEYS, "protect_metrics": True}) as (url, http):
        assert (await call(http, "GET", url + "/metrics"))[0] == 401
        assert (await call(http, "GET", url + "/metrics", bearer(USER_KEY)))[0] == 200


async def test_a_requests_tenant_is_its_keys_whatever_the_tenant_header_says() -> None:
    outcomes: list[Outcome] = []
    async with gateway({"keys": KEYS}, outcomes) as (url, http):
        spoofed = {**bearer(USER_KEY), "x-kvgate-tenant": "someone-else"}
        assert (await call(http, "POST", url + "/v1/chat/completions", spoofed))[0] == 200
        assert (await call(http, "POST", url + "/v1/chat/completions",
                           bearer(HASHED_KEY)))[0] == 200
    assert [o.tenant for o in outcomes] == ["team-a", "bob"]


async def eventually_stored(http: aiohttp.ClientSession, url: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10.0
    while (await call(http, "GET", url + "/admin/cache", bearer(ADMIN_KEY)))[2]["entries"] < 1:
        assert asyncio.get_running_loop().time() < deadline, "the answer was never stored"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("scope", "shared"),
    [
        pytest.param("global", True, id="global scope: one tenant's answer serves another"),
        pytest.param("tenant", False, id="tenant scope: tenants share no answer"),
    ],
)
async def test_the_cache_scope(scope: str, shared: bool) -> None:
    cache = {"enabled": True, "scope": scope, "max_temperature": None}  # any temperature cached
    async with gateway({"keys": KEYS}, cache=cache) as (url, http):
        _, headers, _ = await call(http, "POST", url + "/v1/chat/completions", bearer(USER_KEY))
        assert headers["x-kvgate-cache"] == "miss"
        await eventually_stored(http, url)  # answers are stored off the request's path
        _, headers, _ = await call(http, "POST", url + "/v1/chat/completions", bearer(USER_KEY))
        assert headers["x-kvgate-cache"] == "exact"
        _, headers, _ = await call(http, "POST", url + "/v1/chat/completions",
                                   bearer(HASHED_KEY))
        assert headers["x-kvgate-cache"] == ("exact" if shared else "miss")


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        pytest.param([{"name": "a"}], "exactly one of key and sha256", id="neither secret"),
        pytest.param([{"name": "a", "key": USER_KEY, "sha256": "0" * 64}],
                     "exactly one of key and sha256", id="both secrets"),
        pytest.param([{"name": "a", "key": "short"}], "at least 16", id="a short key"),
        pytest.param([{"name": "a", "sha256": "xyz"}], "pattern", id="a malformed sha256"),
        pytest.param([{"name": "a", "key": USER_KEY}, {"name": "a", "key": ADMIN_KEY}],
                     "two keys are named 'a'", id="two keys of one name"),
        pytest.param([{"name": "a", "key": USER_KEY},
                      {"name": "b", "sha256": hashlib.sha256(USER_KEY.encode()).hexdigest()}],
                     "listed twice", id="one key listed twice"),
    ],
)
def test_bad_keys_stop_the_gateway_at_start_naming_the_field(keys: list[dict[str, Any]],
                                                            message: str) -> None:
    with pytest.raises(ConfigError, match="auth.keys") as raised:
        load_settings(environ={}, overrides={"auth": {"keys": keys}})
    assert message in str(raised.value)
