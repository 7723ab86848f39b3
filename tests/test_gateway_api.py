"""The OpenAI-compatible surface, end to end: the official openai client with only base_url changed,
a gateway and two simulated backends on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS

MODEL = PRESETS[DEFAULT_PRESET].model_name
ALIAS = "gpt-4o-mini"
BODY_LIMIT = 4096
TIME_SCALE = 50.0  # the simulators run 50x faster than the modeled GPU


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    async with running_sim(time_scale=TIME_SCALE, seed=1) as a, \
            running_sim(time_scale=TIME_SCALE, seed=2) as b:
        settings = Settings.model_validate({
            "server": {"port": 0, "max_body_bytes": BODY_LIMIT},
            "backends": [{"url": a}, {"url": b}],
            "model_aliases": {ALIAS: MODEL},
        })
        async with running_gateway(settings) as url:
            yield url


@pytest.fixture
async def client(gateway: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


MESSAGES: list[Any] = [{"role": "user", "content": "Say hello to the gateway."}]


async def test_streamed_chat_completion_with_usage(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert text
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_non_streamed_chat_completion_with_usage(client: AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12)
    assert reply.choices[0].message.content
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 12


async def test_streamed_text_completion_with_usage(client: AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


async def test_non_streamed_text_completion_with_usage(client: AsyncOpenAI) -> None:
    reply = await client.completions.create(model=MODEL, prompt="Once upon a", max_tokens=8)
    assert reply.choices[0].text
    assert reply.usage is not None and reply.usage.prompt_tokens >= 1


async def test_requests_are_spread_over_both_backends(client: AsyncOpenAI) -> None:
    backends = set()
    for _ in range(4):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=2)
        backends.add(raw.headers["x-kvgate-backend"])
    assert backends == {"b0", "b1"}


async def test_an_alias_is_served_by_its_real_model(client: AsyncOpenAI) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model=ALIAS, messages=MESSAGES, max_tokens=2)
    assert raw.headers["x-kvgate-model"] == MODEL
    assert raw.parse().model == MODEL


async def test_models_lists_served_models_and_aliases(client: AsyncOpenAI) -> None:
    ids = [m.id async for m in client.models.list()]
    assert ids == sorted([MODEL, ALIAS])


async def test_one_model_is_retrieved_by_its_id_and_an_unknown_one_is_404(
        client: AsyncOpenAI) -> None:
    for name in (MODEL, ALIAS):
        model = await client.models.retrieve(name)
        assert (model.id, model.object, model.owned_by) == (name, "model", "kvgate")
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("kwargs", "error", "param"),
    [
        pytest.param({"model": "no-such-model", "messages": MESSAGES}, openai.NotFoundError,
                     "model", id="unknown model is 404"),
        pytest.param({"model": MODEL, "messages": []}, openai.BadRequestError, "messages",
                     id="empty messages is 400 naming messages"),
        pytest.param({"model": MODEL, "messages": [{"role": 7, "content": "x"}]},
                     openai.BadRequestError, "messages[0].role",
                     id="bad role is 400 naming messages[0].role"),
        pytest.param({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
                     openai.BadRequestError, "messages[0].role",
                     id="a role OpenAI does not know is 400 naming messages[0].role"),
        pytest.param({"model": MODEL, "messages": MESSAGES, "temperature": "hot"},
                     openai.BadRequestError, "temperature", id="a temperature that is no number"),
        pytest.param({"model": MODEL, "messages": MESSAGES, "temperature": 2.5},
                     openai.BadRequestError, "temperature", id="a temperature over 2"),
        pytest.param({"model": MODEL, "messages": MESSAGES, "top_p": 1.5},
                     openai.BadRequestError, "top_p", id="top_p over 1"),
        pytest.param({"model": MODEL, "messages": MESSAGES, "max_tokens": 0},
                     openai.BadRequestError, "max_tokens", id="max_tokens 0 is 400"),
        pytest.param({"model": MODEL, "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]},
                     openai.APIStatusError, None, id="body over the limit is 413"),
    ],
)
async def test_bad_requests_get_openai_errors(
    client: AsyncOpenAI, kwargs: dict[str, Any], error: type[openai.APIStatusError],
    param: str | None,
) -> None:
    with pytest.raises(error) as info:
        await client.chat.completions.create(**kwargs)
    if param is None:
        assert info.value.status_code == 413
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and body["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param(b"{not json", None, id="invalid JSON"),
        pytest.param(b"[1, 2]", None, id="JSON that is not an object"),
        pytest.param(b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}',
                     "stream", id="stream that is not a boolean"),
        pytest.param(b'{"messages": [{"role": "user", "content": "x"}]}', "model",
                     id="missing model"),
        pytest.param(b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
                     "messages[0].content", id="content of the wrong type"),
    ],
)
async def test_malformed_bodies_are_400_in_openai_shape(
    gateway: str, http: aiohttp.ClientSession, body: bytes, param: str | None
) -> None:
    async with http.post(gateway + "/v1/chat/completions", data=body) as resp:
        assert resp.status == 400
        error = orjson.loads(await resp.read())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param


async def test_completions_validate_the_prompt(gateway: str, http: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "prompt": {"not": "a prompt"}}
    async with http.post(gateway + "/v1/completions", json=body) as resp:
        assert resp.status == 400
        assert orjson.loads(await resp.read())["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        pytest.param("GET", "/v1/nothing-here", 404, id="unknown path"),
        pytest.param("GET", "/v1/chat/completions", 405, id="wrong method"),
    ],
)
async def test_routing_errors_use_openai_bodies(
    gateway: str, http: aiohttp.ClientSession, method: str, path: str, status: int
) -> None:
    async with http.request(method, gateway + path) as resp:
        assert resp.status == status
        assert set(orjson.loads(await resp.read())["error"]) == {"message", "type", "param",
                                                                   "code"}
        assert resp.headers["x-request-id"]


async def test_response_headers_on_a_completion(gateway: str, http: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    headers = {"x-request-id": "req-abc-123"}
    async with http.post(gateway + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["x-request-id"] == "req-abc-123"
        assert resp.headers["x-kvgate-backend"] in ("b0", "b1")
        assert resp.headers["x-kvgate-model"] == MODEL
        assert int(resp.headers["openai-processing-ms"]) >= 0


async def test_a_request_id_is_generated_when_the_client_sends_none(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    ids = set()
    for _ in range(2):
        async with http.get(gateway + "/health") as resp:
            ids.add(resp.headers["x-request-id"])
    assert len(ids) == 2 and all(len(i) >= 16 for i in ids)


async def test_health_ready_and_admin_backends(gateway: str, http: aiohttp.ClientSession) -> None:
    async with http.get(gateway + "/health") as resp:
        assert resp.status == 200
    async with http.get(gateway + "/ready") as resp:
        assert resp.status == 200
        assert orjson.loads(await resp.read())["healthy_backends"] == 2
    async with http.get(gateway + "/admin/backends") as resp:
        rows = orjson.loads(await resp.read())["backends"]
    assert [row["id"] for row in rows] == ["b0", "b1"]
    for row in rows:
        assert row["models"] == [MODEL] and row["healthy"] is True and row["inflight"] == 0


async def test_the_poller_runs_with_the_app(gateway: str, http: aiohttp.ClientSession) -> None:
    """Snapshots appear in /admin/backends: the app started the poller."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 5.0
    while True:
        async with http.get(gateway + "/admin/backends") as resp:
            rows = orjson.loads(await resp.read())["backends"]
        if all(row["kv_total_blocks"] is not None for row in rows):
            break
        assert loop.time() < end, "no backend was scraped"
        await asyncio.sleep(0.02)
    assert all(row["format"] == "vllm" and row["last_poll_age_ms"] is not None for row in rows)


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_no_healthy_backend_means_not_ready_and_503(http: aiohttp.ClientSession) -> None:
    settings = Settings.model_validate({
        "server": {"port": 0},
        "backends": [{"url": f"http://127.0.0.1:{unused_port()}", "models": ["m"]}],
    })
    async with running_gateway(settings) as url:
        async with http.get(url + "/ready") as resp:
            assert resp.status == 503
        body = {"model": "m", "messages": MESSAGES}
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 503
            assert orjson.loads(await resp.read())["error"]["code"] == "no_healthy_backend"
        async with http.get(url + "/v1/models") as resp:
            assert orjson.loads(await resp.read())["data"] == []
