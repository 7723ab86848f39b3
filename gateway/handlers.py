"""The HTTP endpoints: OpenAI's completions and models, health, readiness and the admin view.

Handlers validate at the edge and hand a ready `UpstreamCall` to the proxy. They raise
`GatewayError`s; the error middleware turns them into OpenAI bodies.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from aiohttp import web

from gateway.admission import GATE, Overloaded, body_usage, job_of, tenant_of
from gateway.auth import AUTH_KEY, KeyInfo
from gateway.cache.cache import CacheTap
from gateway.cache.http import admin_cache, admin_cache_flush, consult
from gateway.cache.keys import Kind
from gateway.errors import BodyTooLarge, ModelNotFound, RateLimited
from gateway.keys import (
    ARRIVED_AT,
    CLOCK,
    FLEET,
    KEYRING,
    MODEL_ROUTES,
    OBSERVATION,
    PROXY,
    REQUEST_ID,
    SETTINGS,
    STARTED_AT,
)
from gateway.observation import note_request, prompt_text
from gateway.proxy import UpstreamCall
from gateway.ratelimit import estimated_tokens
from gateway.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    decode_object,
    model_list,
    validate,
)
from gateway.small_model import choose
from routing.model_select import LARGE_FREE, OVERFLOW

JSON = "application/json"
KINDS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "text"}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, ChatCompletionRequest, "/v1/chat/completions")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, CompletionRequest, "/v1/completions")


async def _complete(
    request: web.Request,
    schema: type[ChatCompletionRequest] | type[CompletionRequest],
    path: str,
) -> web.StreamResponse:
    app = request.app
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        limit = app[SETTINGS].server.max_body_bytes
        raise BodyTooLarge(f"the request body is larger than the limit of {limit} bytes") from exc
    data = decode_object(raw)
    body = validate(schema, data)
    observation = request[OBSERVATION]
    note_request(observation, body.model, body.stream, data)
    route = app[MODEL_ROUTES].get(body.model)
    # A small-model routing alias is served by its large model unless `choose` says otherwise.
    model = route.large if route else app[SETTINGS].model_aliases.get(body.model, body.model)
    fleet = app[FLEET]
    if not any(model in fleet.models_of(spec.id) for spec in fleet.specs):
        raise ModelNotFound(f"the model {body.model!r} does not exist", param="model")
    routing = app[SETTINGS].routing
    key = request.get(AUTH_KEY)  # with API keys on, a request's tenant is its key's
    tenant = key.tenant if key is not None else tenant_of(request.headers, routing.tenant_header)
    # The cache before the model choice (DESIGN.md): an alias's answers serve the alias,
    # whichever of its models wrote them.
    cached = await consult(request, KINDS[path], data, body.model if route else model,
                           stream=body.stream, include_usage=body.include_usage, tenant=tenant)
    if isinstance(cached, web.StreamResponse):
        return cached
    try:
        selection = choose(request, route, data, body.output_cap) if route else None
        if selection is not None:
            model = selection.model
        charged = _charge_tokens(request, key, data, body.output_cap)
        response: web.StreamResponse | None = None
        try:
            try:
                response = await _forward(request, path, raw, data, body, model, tenant, cached)
            except Overloaded:
                if route is None or selection is None or selection.reason != LARGE_FREE:
                    raise
                # Mode overflow: the large model refused an easy request (its queue is full, or
                # it is past its TPOT SLO): the small one takes it instead of a 429.
                observation.small_model, observation.model_reason = True, OVERFLOW
                response = await _forward(request, path, raw, data, body, route.small, tenant,
                                          cached)
            return response
        finally:
            if key is not None and charged:
                _settle_tokens(request, key, charged, response)
    finally:
        if cached is not None:
            cached.release()  # identical requests waiting for this one's answer stop waiting


def _charge_tokens(request: web.Request, key: KeyInfo | None, data: dict[str, Any],
                   max_tokens: int | None) -> int:
    """Charges a key with `tpm` the request's estimated tokens (0 without one); RateLimited
    when its budget does not hold them (gateway/ratelimit.py)."""
    if key is None or key.tpm is None:
        return 0
    tokens = estimated_tokens(len(prompt_text(data) or ""), max_tokens)
    wait = request.app[KEYRING].charge(key, tokens, request.app[CLOCK]())
    if wait > 0.0:
        raise RateLimited(f"the key {key.name!r} is over its {key.tpm} tokens a minute",
                          retry_after_s=max(1, math.ceil(wait)))
    return tokens


def _settle_tokens(request: web.Request, key: KeyInfo, charged: int,
                   response: web.StreamResponse | None) -> None:
    """The request ended: its usage (a stream's, or the JSON answer's) replaces its estimate.
    One no backend took (refused by admission, or the client gone while queued) used nothing;
    one a backend served without saying its usage keeps the estimate."""
    outcome = request[OBSERVATION].outcome
    usage = outcome.usage if outcome is not None else None
    if usage is None and isinstance(response, web.Response):
        usage = body_usage(response.body)
    if usage is not None:
        used = sum(v for name in ("prompt_tokens", "completion_tokens")
                   if isinstance(v := usage.get(name), int))
    elif outcome is None or outcome.backend_id is None:
        used = 0
    else:
        return
    request.app[KEYRING].settle(key, charged, used, request.app[CLOCK]())


async def _forward(request: web.Request, path: str, raw: bytes, data: dict[str, Any],
                   body: ChatCompletionRequest | CompletionRequest, model: str, tenant: str,
                   tap: CacheTap | None) -> web.StreamResponse:
    """Admission, routing and the proxy for a request the cache did not answer."""
    app = request.app
    routing = app[SETTINGS].routing
    observation = request[OBSERVATION]
    # The client's bytes go upstream unchanged unless the model is an alias or a stream's usage
    # must be asked for: the gateway learns each backend's speed from its streams' token counts.
    strip_usage = body.stream and not body.include_usage and app[SETTINGS].server.stream_usage
    if strip_usage:
        options = data.get("stream_options")
        data["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                  "include_usage": True}
    if model != body.model:
        data["model"] = model
    if strip_usage or model != body.model:
        raw = orjson.dumps(data)
    job = job_of(request, data, model=model, request_id=request[REQUEST_ID],
                 max_tokens=body.output_cap, stream=body.stream,
                 priority_header=routing.priority_header,
                 session_header=routing.session_header, tenant=tenant)
    observation.tenant = job.tenant
    call = UpstreamCall(
        path=path,
        body=raw,
        model=model,
        stream=body.stream,
        job=job,
        request_id=request[REQUEST_ID],
        arrived_at=request[ARRIVED_AT],
        timing=observation.timing,
        trace=observation.trace,
        strip_usage=strip_usage,
        choices=body.n or 1,
        tap=tap,
    )
    return await app[PROXY].forward(request, call)


async def list_models(request: web.Request) -> web.Response:
    app = request.app
    routes = app[MODEL_ROUTES]
    names = set(app[FLEET].healthy_models()) | set(app[SETTINGS].model_aliases) | set(routes)
    return _json(model_list(sorted(names), created=app[STARTED_AT]))


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    healthy = sum(1 for spec in fleet.specs if fleet.is_healthy(spec.id))
    status = 200 if healthy else 503
    body = {"status": "ready" if healthy else "unavailable", "healthy_backends": healthy}
    return _json(body, status=status)


async def admin_backends(request: web.Request) -> web.Response:
    app = request.app
    rows = app[FLEET].admin_rows(app[CLOCK]())
    dispatcher = app[GATE].dispatcher
    for row in rows:
        scale, replies = dispatcher.learned_speed(str(row["id"]))
        row["speed_scale"] = None if scale is None else round(scale, 3)
        row["speed_replies"] = replies
    return _json({"backends": rows})


def _json(payload: dict[str, Any], *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type=JSON)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/admin/backends", admin_backends)
    app.router.add_get("/admin/cache", admin_cache)
    app.router.add_delete("/admin/cache", admin_cache_flush)
