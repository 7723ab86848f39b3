"""The cache on the request path: look the request up, replay a hit, or hand the proxy a tap.

`lookup` runs on the completion path once the body is valid and its model chosen, before the
request reaches admission: a hit never queues, never takes a lease and never touches a backend.
Its answer is replayed in the shape the client asked for, a JSON body or an SSE stream (with the
usage chunk when `stream_options.include_usage` is set), with `x-kvgate-cache: exact|semantic`,
`x-kvgate-model` and no `x-kvgate-backend`. The key is the chosen model's: an answer serves only
requests sent to the model that wrote it.

The client steers it per request with `Cache-Control` (RFC 9111's request directives):
`no-cache` skips the lookup (the fresh answer is still stored), `no-store` keeps the answer out
of the cache (either way the request is `bypass` when no lookup ran), and `max-age=N` takes only
an answer made at most N seconds ago.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.backend_settings import BackendSettings
from gateway.cache.answer import (
    CachedAnswer,
    EventWriter,
    render_events,
    render_json,
    usage_of,
)
from gateway.cache.cache import EXACT, CacheTap, Hit
from gateway.cache.keys import Bypass, CacheKey, Kind
from gateway.cache.live import Live
from gateway.cache.shadow import decoded
from gateway.errors import CacheUnavailable
from gateway.exchange import Exchange
from gateway.headers import CACHE_HEADER, prepare_stream
from gateway.keys import CACHE, CLOCK, FLEET, SETTINGS
from gateway.sse import DONE_EVENT, error_event
from routing.fleet import Fleet

_ID_PREFIX: Mapping[Kind, str] = {"chat": "chatcmpl-", "text": "cmpl-"}
ADMIN_TIMEOUT_S = 30.0  # an admin endpoint whose store calls take longer answers 503


@dataclass(frozen=True, slots=True)
class Answered:
    """The cache answered: a stored answer replayed, or an identical stream followed."""

    response: web.StreamResponse
    tier: str  # the x-kvgate-cache value
    model: str  # the model that wrote the answer
    usage: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Missed:
    """No answer: `looked` says whether a lookup ran (a `miss`) or not (`bypass`); `tap`, when
    the answer may be stored, sees it relayed and must be released when the request ends."""

    looked: bool
    tap: CacheTap | None


BYPASSED = Missed(looked=False, tap=None)


async def lookup(request: web.Request, ex: Exchange, data: Mapping[str, Any], model: str, *,
                 stream: bool, include_usage: bool, tenant: str) -> Answered | Missed:
    """`data` is the client's request as parsed, `model` the real model it is sent to; with
    `cache.scope: tenant` the `tenant`'s entries are its own."""
    cache = request.app.get(CACHE)
    if cache is None or not cache.available:
        return BYPASSED
    kind = ex.endpoint.kind
    settings = request.app[SETTINGS]
    scope = tenant if settings.cache.scope == "tenant" else None
    revision = revision_of(settings.backends, request.app[FLEET], model)
    key = cache.key(kind, data, model, scope=scope, revision=revision)
    if isinstance(key, Bypass):
        return BYPASSED

    def rekey(answer: CachedAnswer) -> CacheKey:
        assert isinstance(key, CacheKey)
        return cache.rekeyed(key, data, scope, revision, answer)

    directives = cache_directives(ex.headers.get("Cache-Control", ""))
    store = "no-store" not in directives
    max_age_s = _seconds(directives.get("max-age"))
    if "no-cache" in directives:
        if not store:
            return BYPASSED
        return Missed(False, cache.tap(key, await cache.embedding(key), stream=stream,
                                       rekey=rekey))
    clock = request.app[CLOCK]
    ex.timing.cache_start = clock()
    # A whole answer may wait for an identical request already in flight; a stream may not:
    # its first token would come only when the other's last did.
    follow_s = None if stream else request.app[SETTINGS].server.first_byte_timeout_s
    found = await cache.lookup(key, follow_s=follow_s, max_age_s=max_age_s)
    ex.timing.cache_end = clock()
    if found.hit is not None:
        return await replay(request, ex, found.hit, kind, stream=stream,
                            include_usage=include_usage)
    live = cache.live_of(key) if stream else None
    if live is not None:
        followed = await follow(request, ex, live, kind, include_usage=include_usage)
        if followed is not None:
            return followed
    if not store:
        return Missed(True, None)
    return Missed(True, cache.tap(key, found.vector, stream=stream, shadow=found.shadow,
                                  rekey=rekey))


def revision_of(backends: Sequence[BackendSettings], fleet: Fleet, model: str) -> str | None:
    """The configured `model_revision`s of the backends serving `model`, joined; None when
    none has one."""
    configured = {backend.id or f"b{i}": backend.model_revision
                  for i, backend in enumerate(backends) if backend.model_revision}
    if not configured:
        return None
    found = sorted({configured[spec.id] for spec in fleet.specs
                    if spec.id in configured and model in fleet.models_of(spec.id)})
    return ",".join(found) if found else None


def cache_directives(value: str) -> dict[str, str | None]:
    """The directives of a Cache-Control header: lower-cased names to their values, None for a
    directive without one (`no-cache, max-age=60` → {"no-cache": None, "max-age": "60"})."""
    directives: dict[str, str | None] = {}
    for part in value.split(","):
        name, has_value, given = part.partition("=")
        if name.strip():
            directives[name.strip().lower()] = given.strip().strip('"') if has_value else None
    return directives


def _seconds(value: str | None) -> float | None:
    """A delta-seconds value (RFC 9111 1.2.2); None when absent or malformed (ignored)."""
    if value is None or not value.isdigit():
        return None
    return float(value)


async def replay(request: web.Request, ex: Exchange, hit: Hit, kind: Kind, *, stream: bool,
                 include_usage: bool) -> Answered:
    answer = hit.answer
    answered = usage_of(answer)
    response_id = _ID_PREFIX[kind] + uuid.uuid4().hex
    created = int(time.time())
    headers = {CACHE_HEADER: hit.tier, "x-kvgate-model": answer.model,
               # RFC 9111's Age: how long ago the answer was made; the similarity says how near.
               "Age": str(max(0, int(created - hit.created))),
               "x-kvgate-cache-similarity": f"{hit.similarity:.3f}"}
    if not stream:
        response = web.Response(
            body=render_json(answer, response_id=response_id, created=created),
            content_type="application/json", headers=headers)
        return Answered(response, hit.tier, answer.model, answered)
    streamed = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no", **headers})
    events = render_events(answer, response_id=response_id, created=created,
                           include_usage=include_usage)
    clock = request.app[CLOCK]
    with contextlib.suppress(ConnectionResetError):  # the client left: nothing more to do
        await prepare_stream(request, streamed, ex, clock())
        # The whole answer is known: one write, so its first token leaves now.
        ex.timing.first_byte = clock()
        await streamed.write(b"".join(events))
        await streamed.write_eof()
    return Answered(streamed, hit.tier, answer.model, answered)


async def follow(request: web.Request, ex: Exchange, live: Live, kind: Kind, *,
                 include_usage: bool) -> Answered | None:
    """An identical stream's text, relayed as it comes (an `exact` hit); None when the leader
    failed or turned out unreplayable before a byte was sent (the caller asks a backend)."""
    waker = live.subscribe()
    response: web.StreamResponse | None = None
    writer: EventWriter | None = None
    model = live.model or "-"
    sent = 0
    try:
        while True:
            pieces = live.read(sent)
            if live.spoiled or (live.ended and live.answer is None):
                break
            if (pieces or live.ended) and response is None:
                model = live.answer.model if live.answer is not None else live.model or "-"
                response, writer = await _start(request, ex, kind, model, include_usage)
            if pieces:
                assert response is not None and writer is not None
                await response.write(b"".join(writer.piece(piece) for piece in pieces))
                if not sent:  # TTFT: the first text, not the role chunk before it
                    ex.timing.first_byte = request.app[CLOCK]()
                sent += len(pieces)
            if live.ended and live.answer is not None:
                assert response is not None and writer is not None
                await response.write(b"".join(writer.end(live.answer)))
                await response.write_eof()
                return Answered(response, EXACT, model, usage_of(live.answer))
            await waker.wait()
            waker.clear()
    except ConnectionResetError:  # the client left
        return None if response is None else Answered(response, EXACT, model, None)
    finally:
        live.unsubscribe(waker)
    if response is None:
        return None
    # The leader failed after this stream began: end it as the proxy ends a broken stream.
    await response.write(error_event("the identical request this stream followed failed",
                                     code="upstream_stream_failed") + DONE_EVENT)
    await response.write_eof()
    return Answered(response, EXACT, model, None)


async def _start(request: web.Request, ex: Exchange, kind: Kind, model: str,
                 include_usage: bool) -> tuple[web.StreamResponse, EventWriter]:
    """A followed stream's response, its headers and first chunk sent."""
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no", CACHE_HEADER: EXACT, "x-kvgate-model": model,
        "x-kvgate-cache-similarity": "1.000"})
    await prepare_stream(request, response, ex, request.app[CLOCK]())
    writer = EventWriter(kind, model, response_id=_ID_PREFIX[kind] + uuid.uuid4().hex,
                         created=int(time.time()), include_usage=include_usage)
    await response.write(writer.start())
    return response, writer


async def admin_cache(request: web.Request) -> web.Response:
    """GET /admin/cache: the store's entries and shared counters (`kvgate cache stats` for any
    store, the in-memory one included)."""
    cache = request.app.get(CACHE)
    if cache is None:
        return web.json_response({"enabled": False}, dumps=_dumps)
    settings = request.app[SETTINGS].cache
    await cache.flush_counts()  # this replica's latest lookups count too
    try:
        async with asyncio.timeout(ADMIN_TIMEOUT_S):
            entries, counters = await cache.store.count(), await cache.store.counters()
    except Exception as exc:
        raise CacheUnavailable(f"the cache store does not answer: {type(exc).__name__}") from exc
    return web.json_response({
        "enabled": True, "store": settings.store, "available": cache.available,
        "semantic": settings.semantic, "similarity_threshold": cache.threshold,
        "entries": entries, "counters": counters}, dumps=_dumps)


async def admin_cache_shadow(request: web.Request) -> web.Response:
    """GET /admin/cache/shadow: shadow mode's records, newest first (`kvgate cache
    shadow-report --gateway URL`, for any store, the in-memory one included)."""
    cache = request.app.get(CACHE)
    if cache is None:
        return web.json_response({"enabled": False, "records": []}, dumps=_dumps)
    try:
        async with asyncio.timeout(ADMIN_TIMEOUT_S):
            raw = await cache.store.shadow_records()
    except Exception as exc:
        raise CacheUnavailable(f"the cache store does not answer: {type(exc).__name__}") from exc
    records = [record for record in map(decoded, raw) if record is not None]
    return web.json_response({"enabled": True, "records": records}, dumps=_dumps)


async def admin_cache_flush(request: web.Request) -> web.Response:
    """DELETE /admin/cache: every entry and counter of the store removed (after a model's weights
    changed under the same name, say); `{"removed": N}`. With a Redis store, every replica's."""
    cache = request.app.get(CACHE)
    if cache is None:
        return web.json_response({"enabled": False, "removed": 0}, dumps=_dumps)
    try:
        async with asyncio.timeout(ADMIN_TIMEOUT_S):
            removed = await cache.store.flush()
    except Exception as exc:
        raise CacheUnavailable(f"the cache store does not answer: {type(exc).__name__}") from exc
    return web.json_response({"enabled": True, "removed": removed}, dumps=_dumps)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
