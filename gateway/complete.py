"""The completion endpoints' path, top to bottom, in one function: `serve`.

    authorize → parse → model choice → cache lookup → cost estimate (the Job) → admission and
    the proxy → record

`complete` opens the request's `Exchange` (gateway/exchange.py) at arrival and records it once
when `serve` ends, however it ends (gateway/observe.py); whatever the client gets carries the
exchange's headers (gateway/headers.py). Each step takes the exchange, or the parts of it that
it needs, as arguments and returns a value; the proxy returns the request's `Outcome`, which the
token-budget settlement, the cache's store side, telemetry and the headers read.

The cache is looked up after the model choice, keyed by the chosen model: an alias's answer
serves only requests sent to the model that wrote it. A request the small model takes on
overflow (the large one refused it) is not stored, its key being the large model's.

Handlers raise `GatewayError`s; the error middleware (gateway/app.py) turns them into OpenAI
bodies.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from functools import partial

import orjson
from aiohttp import web

from gateway.admission import Overloaded
from gateway.attempt import CLIENT_CLOSED, ClientGone, Forwarded, Outcome
from gateway.auth import KeyInfo, authorize
from gateway.body import parse
from gateway.cache.cache import CacheTap
from gateway.cache.http import Answered, lookup
from gateway.errors import GatewayError, ModelNotFound, RateLimited
from gateway.exchange import (
    CHAT,
    TEXT,
    Asked,
    Endpoint,
    Exchange,
    job_of,
)
from gateway.headers import stamp, stamp_error
from gateway.keys import CLOCK, FLEET, KEYRING, MODEL_ROUTES, PROXY, SETTINGS
from gateway.observe import RECORDER
from gateway.ratelimit import estimated_tokens, tokens_used
from gateway.relay import UpstreamCall
from gateway.schemas import Validator, validate_chat, validate_completion
from gateway.small_model import choose
from gateway.telemetry.outcome import CACHE_MISS
from routing.dispatch import Job
from routing.model_select import LARGE_FREE, OVERFLOW, Selection, SmallModelRoute

INTERNAL_STATUS = 500


async def chat_completions(request: web.Request) -> web.StreamResponse:
    max_messages = request.app[SETTINGS].server.max_messages
    return await complete(request, CHAT, partial(validate_chat, max_messages=max_messages))


async def completions(request: web.Request) -> web.StreamResponse:
    return await complete(request, TEXT, validate_completion)


async def complete(request: web.Request, endpoint: Endpoint,
                   schema: Validator) -> web.StreamResponse:
    """`serve`, recorded exactly once on every path, its answer carrying the exchange's
    headers."""
    recorder, clock = request.app[RECORDER], request.app[CLOCK]
    ex = recorder.arrive(request.headers, endpoint)
    try:
        response = await serve(request, ex, schema)
    except GatewayError as exc:
        recorder.finish(ex, exc.status, whole=False)
        stamp_error(exc, ex, clock(), _route(ex))
        raise
    except asyncio.CancelledError:  # the client hung up
        recorder.finish(ex, CLIENT_CLOSED, whole=False)
        raise
    except BaseException:  # the error middleware answers it; it is recorded all the same
        recorder.finish(ex, INTERNAL_STATUS, whole=False)
        raise
    whole = not response.prepared
    recorder.finish(ex, response.status, whole=whole)
    if whole:
        stamp(response.headers, ex, clock(), _route(ex))
    return response


async def serve(request: web.Request, ex: Exchange, schema: Validator) -> web.StreamResponse:
    """The request's steps, in order; each decision is written on `ex` here (and in the steps
    it calls from here), and only here."""
    app = request.app
    ring = app[KEYRING]
    key = authorize(ring, ex.endpoint.path, ex.headers, app[CLOCK]()) if ring.enabled else None
    asked = ex.asked = await parse(request, ex, schema, key)
    model, route, selection = await choose_model(app, ex, asked)

    looked = await lookup(request, ex, asked.data, model, stream=asked.stream,
                          include_usage=asked.include_usage, tenant=asked.tenant)
    if isinstance(looked, Answered):
        ex.cache, ex.hit_model, ex.hit_usage = looked.tier, looked.model, looked.usage
        return looked.response
    if looked.looked:
        ex.cache = CACHE_MISS
    tap = looked.tap
    try:
        charged = charge_tokens(app, key, asked)
        try:
            routing = app[SETTINGS].routing
            job = job_of(ex, asked, model, priority_header=routing.priority_header,
                         session_header=routing.session_header)
            forwarded = await forward(request, ex, asked, job, tap)
            if (isinstance(forwarded.reply, Overloaded) and route is not None
                    and selection is not None and selection.reason == LARGE_FREE):
                # Mode overflow: the large model refused an easy request (its queue is full, or
                # it is past its TPOT SLO): the small one takes it instead of a 429. Its answer
                # is not stored: the key is the large model's.
                ex.small_model, ex.model_reason = True, OVERFLOW
                if tap is not None:
                    tap.release()
                    tap = None
                forwarded = await forward(request, ex, asked, replace(job, model=route.small),
                                          None)
        finally:
            if key is not None and charged:
                settle_tokens(app, key, charged, ex)
        if tap is not None:
            keep_answer(tap, forwarded.outcome, stream=asked.stream)
    finally:
        if tap is not None:
            tap.release()  # identical requests waiting for this one's answer stop waiting
    if isinstance(forwarded.reply, GatewayError):
        raise forwarded.reply
    return forwarded.reply


async def choose_model(app: web.Application, ex: Exchange, asked: Asked
                       ) -> tuple[str, SmallModelRoute | None, Selection | None]:
    """The real model the request goes to; for a small-model routing alias, the route and its
    choice (the large model unless `choose` says otherwise). ModelNotFound when no backend
    serves the model."""
    route = app[MODEL_ROUTES].get(asked.model)
    model = route.large if route else app[SETTINGS].model_aliases.get(asked.model, asked.model)
    fleet = app[FLEET]
    if not any(model in fleet.models_of(spec.id) for spec in fleet.specs):
        raise ModelNotFound(f"the model {asked.model!r} does not exist", param="model")
    if route is None:
        return model, None, None
    selection = await choose(app, route, asked, ex.headers)
    ex.small_model, ex.model_reason = selection.small, selection.header
    return selection.model, route, selection


def keep_answer(tap: CacheTap, outcome: Outcome, *, stream: bool) -> None:
    """The cache's store side: an answer the client got whole is stored, if it can be
    replayed."""
    if not outcome.whole:
        return
    if outcome.answer is not None:
        tap.whole(outcome.answer)
    elif stream:
        tap.stream_ended(outcome.usage)


def charge_tokens(app: web.Application, key: KeyInfo | None, asked: Asked) -> int:
    """Charges a key with `tpm` the request's estimated tokens (0 without one); RateLimited
    when its budget does not hold them (gateway/ratelimit.py)."""
    if key is None or key.tpm is None:
        return 0
    tokens = estimated_tokens(len(asked.prompt_text or ""), asked.output_cap)
    wait = app[KEYRING].charge(key, tokens, app[CLOCK]())
    if wait > 0.0:
        raise RateLimited(f"the key {key.name!r} is over its {key.tpm} tokens a minute",
                          retry_after_s=max(1, math.ceil(wait)))
    return tokens


def settle_tokens(app: web.Application, key: KeyInfo, charged: int, ex: Exchange) -> None:
    """The request ended: its usage replaces its estimate (gateway/ratelimit.py)."""
    outcome = ex.outcome
    used = tokens_used(outcome.usage if outcome is not None else None,
                       served=outcome is not None and outcome.backend_id is not None)
    if used is not None:
        app[KEYRING].settle(key, charged, used, app[CLOCK]())


async def forward(request: web.Request, ex: Exchange, asked: Asked, job: Job,
                  tap: CacheTap | None) -> Forwarded:
    """Admission, routing and the proxy for `job` (its cost is estimated when it is submitted),
    sent to `job.model`."""
    app = request.app
    settings = app[SETTINGS]
    model = job.model
    # The client's bytes go upstream unchanged unless the model is an alias or a stream's usage
    # must be asked for: the gateway learns each backend's speed from its streams' token counts.
    strip_usage = asked.stream and not asked.include_usage and settings.server.stream_usage
    raw = asked.raw
    if strip_usage or model != asked.model:
        data = dict(asked.data)
        if strip_usage:
            options = data.get("stream_options")
            data["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                      "include_usage": True}
        data["model"] = model
        raw = orjson.dumps(data)
    call = UpstreamCall(path=ex.endpoint.path, body=raw, model=model, stream=asked.stream,
                        strip_usage=strip_usage, choices=asked.choices, tap=tap)
    try:
        forwarded = await app[PROXY].forward(request, ex, call, job)
    except ClientGone as gone:
        ex.outcome = gone.outcome
        raise
    ex.outcome = forwarded.outcome
    return forwarded


def _route(ex: Exchange) -> str | None:
    return ex.outcome.route if ex.outcome is not None else None
