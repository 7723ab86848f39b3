"""`kvgate sim` over real loopback HTTP: the official OpenAI client, vLLM's chunk shapes and error
bodies, aborts on client disconnect, /metrics in every format, and the command itself."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from loadtest.sim.api import MEDIA_PART_TOKENS, ChatMessage, render_chat
from loadtest.sim.launch import running_sim, serving
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS, derive
from loadtest.sim.server import SIM_STATE, SimSettings, create_app
from tests.paths import FIXTURES

KVGATE = str(Path(sys.executable).with_name("kvgate"))  # the installed console script
MODEL = PRESETS[DEFAULT_PRESET].model_name
FAST = 1000.0  # time scale for tests that only need the protocol
DEADLINE_S = 20.0


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async with running_sim(time_scale=FAST) as base:
        yield base


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@contextlib.asynccontextmanager
async def openai_client(base: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client:
        yield client


async def metrics(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """Every sample of /metrics by name and sorted labels, e.g. `vllm:x{a=b}`."""
    async with http.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                              if k not in ("engine", "model_name"))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


def sse_payloads(raw: bytes) -> list[Any]:
    return [orjson.loads(line[6:]) if line != b"data: [DONE]" else "[DONE]"
            for line in raw.split(b"\n") if line.startswith(b"data: ")]


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello to the fleet."}]}
CHAT_LEN = len(render_chat([ChatMessage(role="user", content="Say hello to the fleet.")]).tokens)


async def test_openai_client_streams_a_chat_with_usage_and_finish_reason(url: str) -> None:
    async with openai_client(url) as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=4000,
            stream=True, stream_options={"include_usage": True})
        pieces, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
    assert finish in ("stop", "length")
    assert usage is not None
    assert usage.completion_tokens == len([p for p in pieces if p]) >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_openai_client_streams_a_text_completion(url: str) -> None:
    async with openai_client(url) as client:
        stream = await client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=7, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        texts, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                texts.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
    assert (finish, usage and usage.completion_tokens) == ("length", 7)
    assert len([t for t in texts if t]) == 7


async def test_openai_client_gets_non_streaming_chat_and_completion_with_usage(url: str) -> None:
    async with openai_client(url) as client:
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=5,
            extra_body={"ignore_eos": True})
        text = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=3000)
    assert chat.id.startswith("chatcmpl-") and text.id.startswith("cmpl-")
    assert (chat.choices[0].finish_reason, chat.usage and chat.usage.completion_tokens) == (
        "length", 5)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert text.choices[0].finish_reason in ("stop", "length")
    assert text.usage is not None and text.usage.completion_tokens >= 1


@pytest.mark.parametrize("max_tokens", [1, 33, 500])
async def test_ignore_eos_gives_exactly_max_tokens(url: str, max_tokens: int) -> None:
    async with openai_client(url) as client:
        resp = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count."}], max_tokens=max_tokens,
            extra_body={"ignore_eos": True})
    assert resp.usage is not None and resp.usage.completion_tokens == max_tokens
    assert resp.choices[0].finish_reason == "length"


async def test_the_same_request_gets_the_same_reply(url: str) -> None:
    async with openai_client(url) as client:
        replies = [await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Same words."}], max_tokens=3000)
            for _ in range(2)]
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content
    assert replies[0].usage == replies[1].usage


async def test_chat_stream_has_vllms_chunk_shapes(url: str, http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        ours = sse_payloads(await resp.read())
    theirs = sse_payloads((FIXTURES / "vllm-chat-stream.sse").read_bytes())
    assert ours[-1] == theirs[-1] == "[DONE]"
    first, content, finish, usage = ours[0], ours[1], ours[-3], ours[-2]
    for mine, real in ((first, theirs[0]), (content, theirs[1]), (finish, theirs[-3]),
                       (usage, theirs[-2])):
        assert list(mine) == list(real)
        assert [list(c) for c in mine["choices"]] == [list(c) for c in real["choices"]]
        assert list(mine.get("usage", {})) == list(real.get("usage", {}))
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["id"].startswith("chatcmpl-") and first["object"] == "chat.completion.chunk"
    assert {c["id"] for c in ours[:-1]} == {first["id"]}
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(ours) - 4  # role, finish, usage, DONE


async def test_text_stream_chunks_are_text_completion_objects(
        url: str, http: aiohttp.ClientSession) -> None:
    body = {"prompt": "Hello", "max_tokens": 3, "stream": True, "ignore_eos": True}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        chunks = sse_payloads(await resp.read())
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-")
               for c in chunks[:-1])
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 3 + ["length"]


async def test_image_parts_cost_a_fixed_number_of_prompt_tokens(
        url: str, http: aiohttp.ClientSession) -> None:
    async def prompt_tokens(content: Any) -> int:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            return int((await resp.json())["usage"]["prompt_tokens"])

    text_only = await prompt_tokens("Describe this picture.")
    with_image = await prompt_tokens([
        {"type": "text", "text": "Describe this picture."},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}])
    assert with_image == text_only + MEDIA_PART_TOKENS


ERRORS = [
    ("invalid JSON", "/v1/chat/completions", b"{nope", 400, "BadRequestError", ""),
    ("messages missing", "/v1/chat/completions", b'{"model": "llama-3-8b"}', 400,
     "BadRequestError", "messages"),
    ("max_tokens not an integer", "/v1/completions", b'{"prompt": "a", "max_tokens": "x"}', 400,
     "BadRequestError", "max_tokens"),
    ("n above 1", "/v1/chat/completions",
     orjson.dumps({**CHAT, "n": 2}), 400, "BadRequestError", "n > 1"),
    ("stream options without stream", "/v1/chat/completions",
     orjson.dumps({**CHAT, "stream_options": {"include_usage": True}}), 400, "BadRequestError",
     "stream=True"),
    ("prompt plus max_tokens over the context", "/v1/chat/completions",
     orjson.dumps({**CHAT, "max_tokens": 8190}), 400, "BadRequestError",
     f"maximum context length is 8192 tokens. However, you requested {CHAT_LEN + 8190} tokens "
     f"({CHAT_LEN} in the messages, 8190 in the completion)"),
    ("unknown model", "/v1/completions", b'{"model": "gpt-9", "prompt": "a"}', 404,
     "NotFoundError", "The model `gpt-9` does not exist."),
]


@pytest.mark.parametrize(("path", "body", "status", "kind", "needle"),
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
async def test_bad_requests_get_vllms_error_body(url: str, http: aiohttp.ClientSession,
                                                 path: str, body: bytes, status: int, kind: str,
                                                 needle: str) -> None:
    async with http.post(f"{url}{path}", data=body,
                         headers={"Content-Type": "application/json"}) as resp:
        got = orjson.loads(await resp.read())
    assert resp.status == status
    real = orjson.loads((FIXTURES / "vllm-error.json").read_bytes())
    assert list(got) == list(real) and list(got["error"]) == list(real["error"])
    assert (got["error"]["type"], got["error"]["code"]) == (kind, status)
    assert needle in got["error"]["message"]


async def test_models_and_health(url: str, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{url}/health") as resp:
        assert resp.status == 200
    async with http.get(f"{url}/v1/models") as resp:
        models = await resp.json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == PRESETS[DEFAULT_PRESET].max_model_len


METRIC_NAMES = {
    "vllm": ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:cache_config_info", "vllm:num_preemptions_total",
             "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:request_success_total", "vllm:prompt_tokens_total",
             "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count",
             "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_count"],
    "vllm-v0": ["vllm:gpu_cache_usage_perc", "vllm:num_requests_running",
                "vllm:num_requests_waiting", "vllm:num_requests_swapped",
                "vllm:cache_config_info", "vllm:num_preemptions_total",
                "vllm:gpu_prefix_cache_hit_rate", "vllm:time_to_first_token_seconds_count"],
    "sglang": ["sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs",
               "sglang:max_total_num_tokens", "sglang:page_size",
               "sglang:num_retracted_requests_total", "sglang:time_to_first_token_seconds_count"],
}


@pytest.mark.parametrize("fmt", list(METRIC_NAMES))
async def test_metrics_endpoint_speaks_the_chosen_servers_format(
        fmt: str, http: aiohttp.ClientSession) -> None:
    async with running_sim(time_scale=FAST, metrics_format=fmt) as base:
        async with http.post(f"{base}/v1/chat/completions",
                             json={**CHAT, "max_tokens": 5, "ignore_eos": True}) as resp:
            assert resp.status == 200
        async with http.get(f"{base}/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert set(METRIC_NAMES[fmt]) <= names
    counts = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    ttft = "sglang:time_to_first_token_seconds_count" if fmt == "sglang" else (
        "vllm:time_to_first_token_seconds_count")
    assert counts[ttft] == 1


async def test_metrics_report_the_engines_cache_exactly(http: aiohttp.ClientSession) -> None:
    async with running_sim(time_scale=FAST, num_gpu_blocks=1000) as base:
        m = await metrics(http, base)
        info = [k for k in m if k.startswith("vllm:cache_config_info{")]
        assert len(info) == 1 and "num_gpu_blocks=1000" in info[0] and "block_size=16" in info[0]
        assert m["vllm:kv_cache_usage_perc{}"] == 0.0


async def test_latencies_are_recorded_in_simulated_seconds(http: aiohttp.ClientSession) -> None:
    prompt = "word " * 2000
    async with running_sim(time_scale=FAST) as base:
        async with http.post(f"{base}/v1/completions",
                             json={"prompt": prompt, "max_tokens": 1}) as resp:
            usage = (await resp.json())["usage"]
        m = await metrics(http, base)
    modeled_prefill = derive(PRESETS[DEFAULT_PRESET]).prefill_step_s(usage["prompt_tokens"])
    # Real elapsed x time scale is never below the modeled duration; real seconds would be ~1000x
    # smaller.
    assert m["vllm:time_to_first_token_seconds_sum{}"] >= 0.99 * modeled_prefill


async def test_client_disconnect_mid_stream_aborts_the_request(
        http: aiohttp.ClientSession) -> None:
    async with running_sim(time_scale=20) as base:
        body = {**CHAT, "max_tokens": 7000, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as client:
            resp = await client.post(f"{base}/v1/chat/completions", json=body)
            for _ in range(3):
                assert (await resp.content.readline()).startswith(b"data: ")
                await resp.content.readline()
            m = await metrics(http, base)
            assert m["vllm:num_requests_running{}"] == 1
            resp.close()  # drops the connection mid-stream

        async def aborted() -> bool:
            m = await metrics(http, base)
            return (m["vllm:request_success_total{finished_reason=abort}"] == 1
                    and m["vllm:num_requests_running{}"] == 0
                    and m["vllm:kv_cache_usage_perc{}"] == 0.0)

        await until(aborted, "the stream is aborted and its blocks freed")


async def test_client_disconnect_aborts_a_non_streaming_request(
        http: aiohttp.ClientSession) -> None:
    async with running_sim(time_scale=20) as base:
        body = {**CHAT, "max_tokens": 7000, "ignore_eos": True}

        async def call() -> None:
            async with aiohttp.ClientSession() as client:
                async with client.post(f"{base}/v1/chat/completions", json=body) as resp:
                    await resp.read()

        task = asyncio.create_task(call())

        async def running() -> bool:
            return (await metrics(http, base))["vllm:num_requests_running{}"] == 1

        await until(running, "the request runs")
        task.cancel()  # closes the client's connection
        with contextlib.suppress(asyncio.CancelledError):
            await task

        async def aborted() -> bool:
            m = await metrics(http, base)
            return (m["vllm:request_success_total{finished_reason=abort}"] == 1
                    and m["vllm:num_requests_running{}"] == 0)

        await until(aborted, "the request is aborted")


async def test_an_engine_failure_fails_streams_requests_and_health(
        http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(SimSettings(time_scale=FAST))

    def broken_step() -> None:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(app[SIM_STATE].engine, "step", broken_step)
    async with serving(app) as base:
        async with http.post(f"{base}/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            assert resp.status == 200  # the stream had started
            events = sse_payloads(await resp.read())
        assert events[0]["error"]["code"] == 500 and events[-1] == "[DONE]"
        async with http.post(f"{base}/v1/completions", json={"prompt": "a"}) as resp:
            assert resp.status == 500
            assert (await resp.json())["error"]["type"] == "InternalServerError"
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 503


def test_invalid_settings_are_refused_before_serving() -> None:
    for bad in (SimSettings(preset="nope"), SimSettings(metrics_format="trtllm"),
                SimSettings(time_scale=0)):
        with pytest.raises(ValueError):
            bad.check()


async def test_kvgate_sim_command_serves_until_terminated(http: aiohttp.ClientSession) -> None:
    proc = await asyncio.create_subprocess_exec(
        KVGATE, "sim", "--port", "0", "--time-scale", "100",
        "--metrics-format", "sglang", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), DEADLINE_S)).decode()
        base = line.rsplit(" on ", 1)[1].strip()
        assert base.startswith("http://127.0.0.1:")

        async def healthy() -> bool:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{base}/health") as resp:
                    return resp.status == 200
            return False

        await until(healthy, "kvgate sim answers /health")
        async with http.get(f"{base}/metrics") as resp:
            assert "sglang:token_usage" in await resp.text()
    finally:
        if proc.returncode is None:
            proc.terminate()
        code = await asyncio.wait_for(proc.wait(), DEADLINE_S)
    assert code == 0


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["--describe", "--preset", "llama-3-70b-2xh100"], 0, "KV blocks"),
    (["--preset", "nope"], 2, "unknown preset"),
    (["--metrics-format", "trtllm"], 2, "unknown metrics format"),
], ids=["describe prints the preset's figures", "bad preset is a usage error",
        "unsupported format is a usage error"])
async def test_kvgate_sim_describe_and_usage_errors(args: list[str], code: int,
                                                    needle: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        KVGATE, "sim", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), DEADLINE_S)
    assert proc.returncode == code
    assert needle in (out + err).decode()
