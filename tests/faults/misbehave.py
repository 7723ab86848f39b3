"""A small upstream that misbehaves the way inference servers do, for the fault-injection suite.

    python -m tests.faults.misbehave PORT CHATMODE METRICSMODE [--model NAME]

Chat modes (`POST /v1/chat/completions` and `/v1/completions`):
- `ok`: a short answer (a stream of a few chunks and `[DONE]`, or one JSON body);
- `500`, `503`: that status with an error body in vLLM's shape, no Retry-After;
- `429`: 429 with `Retry-After: RETRY_AFTER_S` and an error body;
- `hang`: nothing at all (no headers) until HANG_S, then the connection is closed;
- `stall`: headers and two chunks, then nothing until HANG_S, then the connection is closed;
- `reset`: headers and two chunks, then a TCP reset;
- `garbage`: 200 `text/event-stream` whose body is not SSE, then the connection is closed;
- `endless`: a chunk every CHUNK_GAP_S until the client leaves, `max_tokens` chunks were sent
  or ENDLESS_S passed (a request without `stream` is answered as in `ok`).
Metrics modes (`GET /metrics`): `good` (a real vLLM V1 payload), `garbage`, `404`, `hang` (no
answer until HANG_S). Every mode ends within a bounded time, so a test that forgets a client
never leaves it behind.

`POST /_mode {"chat": MODE, "metrics": MODE}` switches modes at run time (a backend that comes
back) and `GET /_stats` counts the chat requests and scrapes received so far.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import sys
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from tests.paths import FIXTURES

CHAT_MODES = ("ok", "500", "503", "429", "hang", "stall", "reset", "garbage", "endless")
METRICS_MODES = ("good", "garbage", "404", "hang")
HANG_S = 30.0
ENDLESS_S = 60.0
CHUNK_GAP_S = 0.02
RETRY_AFTER_S = 7
MODEL = "faulty-model"

# vLLM V1's exposition with its served model renamed, so the gateway files it under ours.
_VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(slots=True)
class _State:
    chat: str
    metrics: str
    model: str
    chats: int = 0
    scrapes: int = 0
    payload: bytes = field(default=b"")


STATE = web.AppKey("state", _State)


def _chunk(model: str, text: str, finish: str | None = None) -> bytes:
    event = {"id": "chatcmpl-fault", "object": "chat.completion.chunk", "created": 1,
             "model": model, "choices": [{"index": 0, "delta": {"content": text},
                                          "finish_reason": finish}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"object": "error", "message": message, "type": "ServiceUnavailableError"
            if status == 503 else "InternalServerError", "param": None, "code": status}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                        headers=headers)


async def _begin_stream(request: web.Request, model: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(_chunk(model, "Hel"))
    await response.write(_chunk(model, "lo"))
    return response


def _reset(request: web.Request) -> None:
    """A TCP reset, as a crashing engine's socket gives: SO_LINGER 0, then close."""
    transport = request.transport
    assert transport is not None
    sock: socket.socket | None = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    state.chats += 1
    mode = state.chat
    body = orjson.loads(await request.read() or b"{}")
    stream = bool(body.get("stream")) if isinstance(body, dict) else False
    if mode == "500":
        return _error(500, "Internal server error: CUDA error: an illegal memory access")
    if mode == "503":
        return _error(503, "The engine is not ready")
    if mode == "429":
        return _error(429, "Too many requests", {"Retry-After": str(RETRY_AFTER_S)})
    if mode == "hang":
        await asyncio.sleep(HANG_S)
        _reset(request)
        return web.Response(status=500)  # never sent: the transport is gone
    if mode == "garbage":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"\x00\xffnot an event\r\n{{{\n\ndata: {broken json\n\n")
        _reset(request)
        return response
    if not stream:
        if mode in ("stall", "reset"):  # the same faults, before the whole body
            await asyncio.sleep(HANG_S if mode != "reset" else 0.05)
            _reset(request)
            return web.Response(status=500)
        return web.json_response({
            "id": "cmpl-fault", "object": "chat.completion", "created": 1, "model": state.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    response = await _begin_stream(request, state.model)
    if mode == "stall":
        await asyncio.sleep(HANG_S)
        _reset(request)
        return response
    if mode == "reset":
        await asyncio.sleep(0.05)
        _reset(request)
        return response
    if mode == "endless":
        loop = asyncio.get_running_loop()
        end = loop.time() + ENDLESS_S
        chunks = body.get("max_tokens")
        left = chunks if isinstance(chunks, int) and chunks > 0 else None
        while loop.time() < end and (left is None or left > 0):
            left = None if left is None else left - 1
            await asyncio.sleep(CHUNK_GAP_S)
            await response.write(_chunk(state.model, " more"))
    await response.write(_chunk(state.model, "!", "stop"))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def metrics(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    state.scrapes += 1
    if state.metrics == "404":
        raise web.HTTPNotFound()
    if state.metrics == "garbage":
        return web.Response(body=b"\x00\x01 this is { not prometheus\nvllm:kv 1 2 3 4 x\n",
                            content_type="text/plain")
    if state.metrics == "hang":
        await asyncio.sleep(HANG_S)
    return web.Response(body=state.payload, content_type="text/plain", charset="utf-8")


async def models(request: web.Request) -> web.Response:
    name = request.app[STATE].model
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 1, "owned_by": "faults"}]})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def set_mode(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = orjson.loads(await request.read())
    chat_mode, metrics_mode = body.get("chat", state.chat), body.get("metrics", state.metrics)
    if chat_mode not in CHAT_MODES or metrics_mode not in METRICS_MODES:
        raise web.HTTPBadRequest(text=f"unknown mode {chat_mode!r} / {metrics_mode!r}")
    state.chat, state.metrics = chat_mode, metrics_mode
    return web.json_response({"chat": state.chat, "metrics": state.metrics})


async def stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"chat": state.chats, "metrics": state.scrapes,
                              "chat_mode": state.chat, "metrics_mode": state.metrics})


def create_app(chat_mode: str = "ok", metrics_mode: str = "good",
               model: str = MODEL) -> web.Application:
    if chat_mode not in CHAT_MODES or metrics_mode not in METRICS_MODES:
        raise ValueError(f"unknown mode {chat_mode!r} / {metrics_mode!r}")
    app = web.Application(client_max_size=64 * 1024 * 1024)  # the 30 MB body row
    payload = (FIXTURES / "vllm-v1.prom").read_text().replace(_VLLM_MODEL, model).encode()
    app[STATE] = _State(chat=chat_mode, metrics=metrics_mode, model=model, payload=payload)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_post("/_mode", set_mode)
    app.router.add_get("/_stats", stats)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.misbehave")
    parser.add_argument("port", type=int)
    parser.add_argument("chat", choices=CHAT_MODES)
    parser.add_argument("metrics", choices=METRICS_MODES)
    parser.add_argument("--model", default=MODEL)
    args = parser.parse_args(argv)
    app = create_app(args.chat, args.metrics, args.model)
    print(f"misbehave: {args.chat}/{args.metrics} on http://127.0.0.1:{args.port}", flush=True)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None,
                handler_cancellation=True, shutdown_timeout=0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
