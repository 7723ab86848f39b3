"""`kvgate sim`'s HTTP server: an OpenAI-compatible, vLLM-like backend over the simulated engine.

`create_app(settings)` wires one engine, its real-time driver and the chosen metrics format into
an aiohttp app; the driver task lives in the app's cleanup context. Run the app with
`handler_cancellation=True` (as `launch.running_sim` and `serve` do): a client that disconnects
cancels its handler, which aborts the request in the engine at once and frees its blocks.

Endpoints: POST /v1/chat/completions, POST /v1/completions (streaming or not), GET /v1/models,
GET /health, GET /metrics (with prometheus_client's `name[]` filter, loadtest/sim/exposition.py),
and with the llama.cpp metrics format GET /slots as llama-server answers it
(loadtest/sim/slots.py); with the others /slots is a 404, as on a vLLM server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

from aiohttp import web

from loadtest.sim.api import (
    DONE,
    ChatCompletionRequest,
    ChunkEncoder,
    CompletionRequest,
    Kind,
    RenderedPrompt,
    SimError,
    completion_body,
    models_body,
    parse_body,
    render_chat,
    render_completion,
    resolve_max_tokens,
)
from loadtest.sim.driver import EngineFailed, LiveRequest, RealtimeDriver
from loadtest.sim.engine import Engine, SimRequest
from loadtest.sim.exposition import CONTENT_TYPE, FORMATS, MetricsFormat, ProcessSample, ServerInfo
from loadtest.sim.presets import DEFAULT_PRESET, PRESETS
from loadtest.sim.slots import CONTENT_TYPE as SLOTS_CONTENT_TYPE
from loadtest.sim.slots import RequestParams, Slots
from loadtest.sim.tokens import natural_output_length, output_piece, output_seed
from routing.physics import Preset

MAX_BODY_BYTES = 64 * 2**20  # long-context prompts are large


@dataclass(frozen=True, slots=True)
class SimSettings:
    """One simulated backend. `model` defaults to the preset's served model name."""

    preset: str = DEFAULT_PRESET
    model: str | None = None
    time_scale: float = 1.0  # every simulated duration is divided by this in real time
    metrics_format: str = "vllm"
    seed: int = 0  # seeds the natural output lengths
    num_gpu_blocks: int | None = None  # override the KV capacity the preset derives
    enable_prefix_caching: bool = True

    def check(self) -> None:
        """ValueError naming the first bad field."""
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r} (known: {', '.join(PRESETS)})")
        if self.metrics_format not in FORMATS:
            raise ValueError(f"unknown metrics format {self.metrics_format!r} "
                             f"(supported: {', '.join(FORMATS)})")
        if not self.time_scale > 0:
            raise ValueError(f"time scale must be > 0, got {self.time_scale}")
        if self.model is not None and not self.model:
            raise ValueError("model name must not be empty")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {self.num_gpu_blocks}")


@dataclass(frozen=True, slots=True)
class SimState:
    settings: SimSettings
    preset: Preset
    model_name: str
    engine: Engine
    driver: RealtimeDriver
    metrics: MetricsFormat
    info: ServerInfo
    started_at: float  # unix seconds
    slots: Slots | None = None  # llama.cpp's GET /slots, with that metrics format only


SIM_STATE = web.AppKey("sim_state", SimState)


def create_app(settings: SimSettings) -> web.Application:
    """The simulator app for `settings` (ValueError if they are invalid)."""
    settings.check()
    preset = PRESETS[settings.preset]
    model_name = settings.model or preset.model_name
    engine = Engine(preset, num_gpu_blocks=settings.num_gpu_blocks,
                    enable_prefix_caching=settings.enable_prefix_caching)
    metrics = FORMATS[settings.metrics_format]
    state = SimState(
        settings=settings, preset=preset, model_name=model_name, engine=engine,
        driver=RealtimeDriver(engine, metrics.new_recorder(), time_scale=settings.time_scale),
        metrics=metrics,
        info=ServerInfo(model_name=model_name, max_model_len=preset.max_model_len,
                        enable_prefix_caching=settings.enable_prefix_caching,
                        gpu_memory_utilization=preset.gpu_memory_utilization),
        started_at=time.time(),
        slots=Slots(engine) if settings.metrics_format == "llamacpp" else None,
    )
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[SIM_STATE] = state
    app.cleanup_ctx.append(_driver_task)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    if state.slots is not None:
        app.router.add_get("/slots", _slots)
    return app


async def _driver_task(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[SIM_STATE].driver.run(), name="kvgate-sim-driver")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, EngineFailed):
        await task


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """The one place SimError becomes an OpenAI error body."""
    try:
        return await handler(request)
    except SimError as exc:
        return web.Response(status=exc.status, body=exc.body(), content_type="application/json")


async def _chat(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    body = parse_body(await request.read(), ChatCompletionRequest)
    _check_model(state, body.model)
    requested = body.max_completion_tokens or body.max_tokens
    return await _generate(request, state, "chat", render_chat(body.messages), requested,
                           body.ignore_eos, body.min_tokens, body.stream,
                           body.stream_options is not None and body.stream_options.include_usage)


async def _completions(request: web.Request) -> web.StreamResponse:
    state = request.app[SIM_STATE]
    body = parse_body(await request.read(), CompletionRequest)
    _check_model(state, body.model)
    return await _generate(request, state, "text", render_completion(body.prompt),
                           body.max_tokens, body.ignore_eos, body.min_tokens, body.stream,
                           body.stream_options is not None and body.stream_options.include_usage)


def _check_model(state: SimState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise SimError(404, f"The model `{model}` does not exist.", param="model")


async def _generate(request: web.Request, state: SimState, kind: Kind, prompt: RenderedPrompt,
                    requested_max: int | None, ignore_eos: bool, min_tokens: int,
                    stream: bool, include_usage: bool) -> web.StreamResponse:
    max_tokens = resolve_max_tokens(requested_max, len(prompt.tokens), state.preset.max_model_len)
    request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    sim_request = SimRequest(
        request_id=request_id, prompt=prompt.tokens, max_tokens=max_tokens,
        natural_len=max(min_tokens, natural_output_length(prompt.key, state.settings.seed)),
        ignore_eos=ignore_eos or min_tokens >= max_tokens)  # vLLM: then cut at max_tokens
    try:
        live = state.driver.submit(sim_request)
    except ValueError as exc:
        raise SimError(400, str(exc)) from exc
    except EngineFailed as exc:
        raise SimError(500, str(exc)) from exc
    if state.slots is not None:
        state.slots.track(request_id, RequestParams(n_predict=max_tokens, stream=stream))
    created = int(time.time())
    try:
        if stream:
            encoder = ChunkEncoder(kind, request_id, created, state.model_name)
            return await _stream(request, live, encoder, output_seed(prompt.key),
                                 len(prompt.tokens), include_usage, opens_with_role=kind == "chat")
        return await _respond(state, live, kind, request_id, created, prompt)
    finally:
        # Normal end: a no-op. Cancelled (client gone) or failed: aborts in the engine.
        state.driver.release(live)
        if state.slots is not None:
            state.slots.untrack(request_id)


async def _stream(request: web.Request, live: LiveRequest, encoder: ChunkEncoder, seed: int,
                  prompt_tokens: int, include_usage: bool, *, opens_with_role: bool
                  ) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    opened = not opens_with_role
    try:
        while True:
            try:
                events = await live.next_events()
            except EngineFailed as exc:
                # As vLLM >= 0.10.1: an error event on the open stream, then [DONE].
                await response.write(b"data: " + SimError(500, str(exc)).body() + b"\n\n" + DONE)
                break
            parts: list[bytes] = []
            if not opened:
                parts.append(encoder.role())
                opened = True
            finish: str | None = None
            completion_tokens = 0
            for event in events:
                parts.append(encoder.token(output_piece(seed, event.token_index)))
                completion_tokens = event.token_index + 1
                finish = event.finish_reason
            if finish is not None:
                parts.append(encoder.finish(finish))
                if include_usage:
                    parts.append(encoder.usage(prompt_tokens, completion_tokens))
                parts.append(DONE)
            await response.write(b"".join(parts))
            if finish is not None:
                break
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away mid-write; the caller's release() aborts the request
    return response


async def _respond(state: SimState, live: LiveRequest, kind: Kind, request_id: str, created: int,
                   prompt: RenderedPrompt) -> web.Response:
    completion_tokens = 0
    finish: str | None = None
    while finish is None:
        try:
            events = await live.next_events()
        except EngineFailed as exc:
            raise SimError(500, str(exc)) from exc
        for event in events:
            completion_tokens = event.token_index + 1
            finish = event.finish_reason
    seed = output_seed(prompt.key)
    text = "".join(output_piece(seed, i) for i in range(completion_tokens))
    body = completion_body(kind, request_id, created, state.model_name, text, finish,
                           len(prompt.tokens), completion_tokens)
    return web.Response(body=body, content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    return web.Response(body=models_body(state.model_name, int(state.started_at),
                                         state.preset.max_model_len),
                        content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    # As vLLM: 200 while the engine runs, 503 once it is dead.
    return web.Response(status=503 if request.app[SIM_STATE].driver.failure else 200)


async def _metrics(request: web.Request) -> web.Response:
    state = request.app[SIM_STATE]
    # `?name[]=a&name[]=b`: only those samples, read from the query as prometheus_client reads
    # it (parse_qs: blank values dropped, so `name[]=` alone asks for everything).
    names = parse_qs(request.query_string).get("name[]")
    text = state.metrics.render(state.engine.stats(), state.driver.recorder, state.info,
                                ProcessSample(time.process_time(), state.started_at), names)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})


async def _slots(request: web.Request) -> web.Response:
    slots = request.app[SIM_STATE].slots
    assert slots is not None  # the route exists only with the llama.cpp format
    return web.Response(body=slots.body(), headers={"Content-Type": SLOTS_CONTENT_TYPE})
