"""Building the response cache from `CacheSettings`, and owning its lifetime in the app.

`cache_running` is a `cleanup_ctx` of `create_app` (only when `cache.enabled`): it builds the
store and the cache, puts it under `keys.CACHE`, and at shutdown waits for the answers still being
stored, then closes the store. A Redis that does not answer at start-up is a warning, not a
failure: the gateway serves without the cache until Redis answers (gateway/cache/cache.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.cache.cache import Embedder, ResponseCache
from gateway.cache.embed import HashingEmbedder
from gateway.cache.redis_store import RedisStore
from gateway.cache.store import CacheStore, MemoryStore
from gateway.config import CacheSettings
from gateway.keys import CACHE, SETTINGS

log = logging.getLogger("kvgate.cache")


def build_store(settings: CacheSettings) -> CacheStore:
    if settings.store == "redis":
        assert settings.redis_url is not None  # CacheSettings checks it
        return RedisStore.from_url(
            settings.redis_url, prefix=settings.key_prefix, ttl_s=settings.ttl_s,
            max_per_namespace=settings.max_per_namespace,
            socket_timeout=settings.timeout_s, socket_connect_timeout=settings.timeout_s)
    return MemoryStore(max_entries=settings.max_entries, ttl_s=settings.ttl_s,
                       max_per_namespace=settings.max_per_namespace)


def build_embedder(settings: CacheSettings) -> Embedder | None:
    """None when the semantic tier is off; `embedder` names the one to build."""
    if not settings.semantic:
        return None
    return HashingEmbedder()


def build_cache(settings: CacheSettings) -> ResponseCache:
    return ResponseCache(
        build_store(settings), build_embedder(settings),
        threshold=settings.similarity_threshold, max_temperature=settings.max_temperature,
        timeout_s=settings.timeout_s)


async def cache_running(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS].cache
    cache = build_cache(settings)
    try:
        await cache.store.counters()
    except Exception as exc:  # the gateway serves without it until the store answers
        log.warning("the cache store (%s) does not answer: %s: %s; serving without the cache"
                    " until it does", settings.store, type(exc).__name__, exc)
    app[CACHE] = cache
    try:
        yield
    finally:
        await cache.close()
