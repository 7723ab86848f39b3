"""What a client that sends something broken sees, and what the log keeps of it: parser-level
faults and undecodable bodies are 400s in OpenAI's shape, a conversation past max_messages is a
400 naming the limit, connections past max_connections are refused with a 503, and a malformed
request is one log line that shows no API key."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from gateway.body import WORKER_BYTES
from gateway.config import Settings
from gateway.serve import running_gateway
from loadtest.sim.launch import running_sim
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from tests.paths import free_port
from tests.waiting import until

REPO = Path(__file__).resolve().parents[1]
MODEL = PRESETS[DEFAULT_PRESET].model_name
MAX_CONNECTIONS = 3
API_KEY = "sk-kvgate-test-0123456789abcdef"
GOOD = orjson.dumps({"model": MODEL, "max_tokens": 2,
                     "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
async def gateway() -> AsyncIterator[str]:
    async with running_sim(time_scale=50.0) as sim:
        settings = Settings.model_validate({
            "server": {"port": 0, "max_connections": MAX_CONNECTIONS},
            "backends": [{"url": sim}],
        })
        async with running_gateway(settings) as url:
            yield url


async def _exchange(base: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Sends `raw` on a fresh connection; the status, headers and body of the answer."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        body = await asyncio.wait_for(reader.readexactly(int(headers["Content-Length"])), 10)
        return int(lines[0].split()[1]), headers, body
    finally:
        writer.close()


def _post(body: bytes, *headers: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"".join(h + b"\r\n" for h in headers)
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-15)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        pytest.param(_post(b"\x00\xffcorrupt", b"Content-Encoding: deflate"), "Content-Encoding",
                     id="corrupt deflate"),
        pytest.param(_post(b"\x1f\x8bcorrupt-gzip", b"Content-Encoding: gzip"),
                     "Content-Encoding", id="corrupt gzip"),
        pytest.param(_post(GOOD, b"Content-Encoding: snappy"), "Content-Encoding",
                     id="unknown encoding"),
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: ten\r\n\r\n", "Content-Length", id="bad Content-Length"),
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", "chunked framing",
                     id="bad chunk size"),
        pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n", "invalid header",
                     id="a control character in a header"),
    ],
)
async def test_broken_requests_are_400_in_openai_shape(gateway: str, raw: bytes,
                                                       words: str) -> None:
    status, headers, body = await _exchange(gateway, raw)
    error = orjson.loads(body)["error"]
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    assert error["type"] == "invalid_request_error" and words in error["message"]


async def test_a_body_that_does_not_decode_ends_its_connection_with_a_close(
        gateway: str) -> None:
    """The gateway cannot read past a corrupt body, so it closes that connection; the answer
    says so, and a pooled client never sends its next request on the dying connection."""
    status, headers, _ = await _exchange(
        gateway, _post(b"\x00\xffcorrupt", b"Content-Encoding: deflate"))
    assert status == 400 and headers.get("Connection", "").lower() == "close"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as http:
        for _ in range(20):
            async with http.post(gateway + "/v1/chat/completions", data=b"\x00\xffcorrupt",
                                 headers={"Content-Encoding": "deflate"}) as resp:
                assert resp.status == 400
            async with http.post(gateway + "/v1/chat/completions", data=GOOD) as resp:
                assert resp.status == 200


async def test_a_body_declared_past_the_limit_is_413_before_it_is_sent(gateway: str) -> None:
    """A Content-Length over `server.max_body_bytes` is refused on its head alone, the
    connection closed: the client need not send (nor the gateway read) the bytes."""
    limit = Settings.model_validate({"backends": [{"url": "http://127.0.0.1:1"}]}
                                    ).server.max_body_bytes
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % (limit + 1))
    status, headers, body = await _exchange(gateway, head)
    assert status == 413
    assert headers.get("Connection", "").lower() == "close"
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_a_deflated_body_still_works(gateway: str) -> None:
    status, _, body = await _exchange(
        gateway, _post(zlib.compress(GOOD), b"Content-Encoding: deflate"))
    assert status == 200, body
    status, _, body = await _exchange(
        gateway, _post(_raw_deflate(GOOD), b"Content-Encoding: deflate"))
    assert status == 200, body


async def test_a_conversation_past_max_messages_is_400_naming_the_limit(gateway: str) -> None:
    messages = [{"role": "user", "content": "x"}] * 10_001
    body = orjson.dumps({"model": MODEL, "messages": messages})
    async with aiohttp.ClientSession() as http, \
            http.post(gateway + "/v1/chat/completions", data=body) as resp:
        error = orjson.loads(await resp.read())["error"]
        assert resp.status == 400
    assert error["param"] == "messages" and "at most 10000 messages" in error["message"]


@pytest.mark.parametrize(
    ("model", "messages", "status", "answer"),
    [
        pytest.param("no-such-model", [{"role": "user", "content": "x" * 3_000_000}], 404,
                     "does not exist", id="a valid 3 MB body goes on to the model choice"),
        pytest.param(MODEL, [{"role": "user", "content": "message"}] * 200_000, 400,
                     "at most 10000", id="200,000 messages are refused naming the limit"),
        pytest.param(MODEL, [{"role": "wizard", "content": "x" * 2_000_000}], 400,
                     "must be one of", id="a wrong field is named"),
    ],
)
async def test_big_bodies_are_checked_off_the_loop_by_the_same_rules(
        gateway: str, model: str, messages: list[dict[str, str]], status: int,
        answer: str) -> None:
    body = orjson.dumps({"model": model, "max_tokens": 1, "messages": messages})
    assert len(body) > WORKER_BYTES  # parsed in the worker
    async with aiohttp.ClientSession() as http, \
            http.post(gateway + "/v1/chat/completions", data=io.BytesIO(body)) as resp:
        error = orjson.loads(await resp.read())["error"]
        assert resp.status == status
    assert answer in error["message"]


async def test_connections_past_the_cap_are_refused_until_one_closes(gateway: str) -> None:
    host, port = gateway.removeprefix("http://").rsplit(":", 1)
    held = []
    for _ in range(MAX_CONNECTIONS):  # open, answered, kept alive
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        held.append(writer)
    try:
        status, headers, body = await _exchange(gateway, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, headers["Retry-After"]) == (503, "1")
        assert orjson.loads(body)["error"]["code"] == "too_many_connections"
        held.pop().close()

        async def refusals_once_admitted() -> float | None:
            status, _, body = await _exchange(gateway, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            if status != 200:
                return None
            return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
                       if line.startswith("kvgate_client_connections_refused_total"))

        refused: list[float] = []

        async def admitted() -> bool:
            count = await refusals_once_admitted()
            if count is not None:
                refused.append(count)
            return count is not None

        await until(admitted, "a connection is admitted once one closed")
        assert refused[-1] >= 1
    finally:
        for writer in held:
            writer.close()


async def test_a_malformed_request_is_one_log_line_without_the_key(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "kvgate.yaml"
    config.write_text(f"server: {{port: {port}, drain_grace_s: 0}}\n"
                      f"auth: {{keys: [{{name: ops, key: {API_KEY}}}]}}\n")
    async with running_sim(time_scale=50.0) as sim:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
            "--backend", sim + "/v1", cwd=REPO, env=environ,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                async def up() -> bool:
                    try:
                        async with http.get(base + "/health") as resp:
                            return resp.status == 200
                    except aiohttp.ClientConnectionError:
                        return False

                await until(up, "kvgate serve answers", timeout_s=30)
            key = API_KEY.encode()
            status, _, _ = await _exchange(
                base, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key
                + b"\x01\r\n\r\n")
            assert status == 400
            status, _, _ = await _exchange(
                base, _post(b"\x00corrupt", b"Authorization: Bearer " + key,
                            b"api-key: " + key, b"Content-Encoding: deflate"))
            assert status == 400
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    logged = (out + err).decode()
    assert proc.returncode == 0, logged
    assert API_KEY not in logged and API_KEY[:12] not in logged
    assert "Traceback" not in logged
    assert len([line for line in logged.splitlines() if "malformed request" in line]) == 1
