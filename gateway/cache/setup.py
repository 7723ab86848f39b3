"""Building the response cache from `CacheSettings`, and owning its lifetime in the app.

`cache_running` is a `cleanup_ctx` of `create_app` (only when `cache.enabled`): it builds the
store and the cache, puts it under `keys.CACHE`, and at shutdown waits for the answers still being
stored, then closes the store. A Redis that does not answer at start-up is a warning, not a
failure: the gateway serves without the cache until Redis answers (gateway/cache/cache.py).

With `cache.semantic` on or shadow, the embedder `cache.embedder` names is built here
(gateway/cache/embedders/choice.py): `auto` is the local model when `kvgate[semantic]` is
installed, else the hashing embedder; the threshold is the embedder's own unless configured.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.cache.cache import ResponseCache
from gateway.cache.embedders.choice import (
    THRESHOLDS,
    EmbedderSettings,
    Kind,
    build,
    local_installed,
    resolve,
)
from gateway.cache.index import SemanticIndex
from gateway.cache.redis_store import RedisStore
from gateway.cache.semantic import Questions
from gateway.cache.store import CacheStore, MemoryStore
from gateway.cache.vector_index import index_maker
from gateway.config import CacheSettings
from gateway.keys import CACHE, SETTINGS

log = logging.getLogger("kvgate.cache")


def build_store(settings: CacheSettings, questions: Questions | None = None) -> CacheStore:
    """The store, its namespaces indexed for `questions`' vectors (sparse or dense)."""
    index = (SemanticIndex if questions is None else index_maker(
        questions.dimensions, dense=questions.dense, max_members=settings.max_per_namespace))
    if settings.store == "redis":
        assert settings.redis_url is not None  # CacheSettings checks it
        # No socket_timeout: every call the cache makes runs under its own `timeout_s`
        # (ResponseCache), and redis-py's would wrap each command's write in a task of its own,
        # a third of an exact hit's CPU. The admin endpoints bound theirs (gateway/cache/http.py).
        return RedisStore.from_url(
            settings.redis_url, prefix=settings.key_prefix, ttl_s=settings.ttl_s,
            max_per_namespace=settings.max_per_namespace, index=index,
            socket_timeout=None, socket_connect_timeout=settings.timeout_s)
    return MemoryStore(max_entries=settings.max_entries, ttl_s=settings.ttl_s,
                       max_per_namespace=settings.max_per_namespace, index=index)


def embedder_kind(settings: CacheSettings) -> Kind:
    """The embedder `cache.embedder` names here (EmbedderUnavailable when it cannot be had)."""
    return resolve(settings.embedder, local_installed())


def build_embedder(settings: CacheSettings, api_key: str | None = None) -> Questions | None:
    """None when the semantic tier is off; else the embedder `cache.embedder` names."""
    if settings.semantic == "off":
        return None
    kind = embedder_kind(settings)
    embedder = build(EmbedderSettings(kind, path=settings.embedder_path,
                                      url=settings.embedder_url or "",
                                      model=settings.embedder_model, api_key=api_key))
    if kind is Kind.LOCAL:  # shared with small-model routing's classifier: embedded once
        from gateway.cache.embedders.local import LocalEmbedder
        from gateway.cache.embedders.remembered import Remembered

        assert isinstance(embedder, LocalEmbedder)
        return Questions(Remembered(embedder))
    return Questions(embedder)


def threshold_of(settings: CacheSettings) -> float:
    """`cache.similarity_threshold`, or the embedder's own default."""
    if settings.similarity_threshold is not None:
        return settings.similarity_threshold
    if settings.semantic == "off":
        return THRESHOLDS[Kind.HASHING]  # no semantic tier: never used
    return THRESHOLDS[embedder_kind(settings)]


def build_cache(settings: CacheSettings) -> ResponseCache:
    questions = build_embedder(settings)
    return ResponseCache(
        build_store(settings, questions), questions,
        threshold=threshold_of(settings), max_temperature=settings.max_temperature,
        shadow=settings.semantic == "shadow", timeout_s=settings.timeout_s)


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
