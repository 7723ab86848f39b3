"""The HTTP endpoints: OpenAI's completions (their path is gateway/complete.py) and models,
health, readiness and the admin views.

Handlers raise `GatewayError`s; the error middleware turns them into OpenAI bodies.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from aiohttp import web

from gateway.admission import GATE
from gateway.cache.http import admin_cache, admin_cache_flush, admin_cache_shadow
from gateway.complete import chat_completions, completions
from gateway.drain import DRAIN
from gateway.errors import ModelNotFound
from gateway.keys import CLOCK, FLEET, MODEL_ROUTES, SETTINGS, STARTED_AT
from gateway.openapi import openapi_json
from gateway.schemas import model_list

JSON = "application/json"


def _model_names(app: web.Application) -> set[str]:
    """What `GET /v1/models` lists: the healthy backends' models, the aliases and the routes."""
    routes = app[MODEL_ROUTES]
    healthy = app[FLEET].healthy_models(app[CLOCK]())
    return set(healthy) | set(app[SETTINGS].model_aliases) | set(routes)


async def list_models(request: web.Request) -> web.Response:
    app = request.app
    return _json(model_list(sorted(_model_names(app)), created=app[STARTED_AT]))


async def retrieve_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: one entry of the list, or 404 `model_not_found`."""
    app = request.app
    name = request.match_info["model"]
    if name not in _model_names(app):
        raise ModelNotFound(f"the model {name!r} does not exist", param="model")
    return _json(model_list([name], created=app[STARTED_AT])["data"][0])


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """200 while at least one backend can take traffic (reachable and not ejected; a Retry-After
    hold-off is short backpressure, not unreadiness) and the gateway is not draining."""
    app = request.app
    fleet, now = app[FLEET], app[CLOCK]()
    healthy = sum(1 for spec in fleet.specs if fleet.is_healthy(spec.id, now))
    draining = app[DRAIN].draining
    status = 200 if healthy and not draining else 503
    word = "draining" if draining else "ready" if healthy else "unavailable"
    body = {"status": word, "healthy_backends": healthy}
    response = _json(body, status=status)
    if status == 503:  # when to ask again: a backend's ejection or hold ending, else soon
        back = None if draining else fleet.back_in(None, now)
        response.headers["Retry-After"] = str(max(1, math.ceil(back or 0.0)))
    return response


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
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)  # ids may hold a slash
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/openapi.json", openapi_json)
    app.router.add_get("/admin/backends", admin_backends)
    app.router.add_get("/admin/cache", admin_cache)
    app.router.add_delete("/admin/cache", admin_cache_flush)
    app.router.add_get("/admin/cache/shadow", admin_cache_shadow)
