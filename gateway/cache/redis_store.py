"""`RedisStore`: the cache shared by every gateway replica, over redis.asyncio.

Layout, every key under `prefix` (default "kvgate:cache:"):

- `{prefix}e:{id}`: a hash {answer, namespace, vector, model, query, created}; `vector` is
  `encode_vector` bytes, or empty for an exact-only entry; expires `ttl_s` after its put.
- `{prefix}ns:{namespace}`: a sorted set of ids scored by `created`, trimmed to the newest
  `max_per_namespace` and expiring with the newest entry's ttl: what `nearest` scans.
- `{prefix}all`: a sorted set of every id by `created`, for `entries`, `count` and `flush`. Each
  put drops the ids created more than `ttl_s` before now (the gateway stores an answer as it is
  created, so their hashes have expired), which keeps it bounded without anyone listing it; an
  entry imported with an older `created` is still served but may leave the listing early.
  `entries` and `count` drop the ids of hashes deleted or expired.
- `{prefix}counters`: a hash of COUNTERS.

Redis errors propagate as redis exceptions: the caller (ResponseCache) fails open. A hash that
does not decode (a field missing or malformed, e.g. written by another version) is skipped as if
absent (`count`, which reads no fields, still counts it) and logged, never raised: one bad entry
must not turn the whole cache off, and the next `put` of that id replaces it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import redis.asyncio as redis
from redis.typing import EncodableT, FieldT

from gateway.cache.store import COUNTERS, Entry, best_match, check_counter, check_limits
from gateway.cache.vectors import Vector, decode_vector, encode_vector

log = logging.getLogger("kvgate.cache")

_FIELDS = (b"answer", b"namespace", b"vector", b"model", b"query", b"created")
_BATCH = 256  # ids read per round trip by entries, count and flush


class RedisStore:
    """The shared store. `client` must return bytes (decode_responses=False, as `from_url`
    makes it): answers and vectors are binary."""

    def __init__(self, client: redis.Redis, *, prefix: str = "kvgate:cache:",
                 ttl_s: float | None, max_per_namespace: int = 256,
                 clock: Callable[[], float] = time.time) -> None:
        check_limits(ttl_s, max_per_namespace)
        self._client = client
        self._clock = clock  # wall-clock seconds: the `all` set's scores
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._ttl_ms = None if ttl_s is None else max(1, round(ttl_s * 1000))
        self._max_per_namespace = max_per_namespace
        self._all = f"{prefix}all"
        self._counters = f"{prefix}counters"

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "kvgate:cache:", ttl_s: float | None,
                 max_per_namespace: int = 256, clock: Callable[[], float] = time.time,
                 **client_options: Any) -> RedisStore:
        """`client_options` go to redis-py (e.g. socket_timeout, socket_connect_timeout);
        ValueError for a URL redis-py cannot read."""
        check_limits(ttl_s, max_per_namespace)  # before there is a client to close
        client = redis.Redis.from_url(url, decode_responses=False, **client_options)
        return cls(client, prefix=prefix, ttl_s=ttl_s, max_per_namespace=max_per_namespace,
                   clock=clock)

    async def get(self, id: str) -> Entry | None:
        fields = cast(dict[bytes, bytes], await self._client.hgetall(self._entry_key(id)))
        return self._decode(id, fields) if fields else None

    async def nearest(self, namespace: str, vector: Vector, threshold: float
                      ) -> tuple[Entry, float] | None:
        ns_key = self._namespace_key(namespace)
        ids = [_text(raw) for raw in
               await self._client.zrange(ns_key, 0, self._max_per_namespace - 1, desc=True)]
        if not ids:
            return None
        async with self._client.pipeline(transaction=False) as pipe:
            for id in ids:
                pipe.hmget(self._entry_key(id), [b"vector", b"namespace"])
            rows: list[list[bytes | None]] = await pipe.execute()
        candidates: list[Entry] = []
        stale: list[str] = []
        for id, (raw_vector, raw_namespace) in zip(ids, rows, strict=True):
            if raw_vector is None:
                stale.append(id)  # its hash expired or was deleted
            elif raw_vector and raw_namespace == namespace.encode():
                try:
                    candidates.append(_probe(id, decode_vector(raw_vector)))
                except ValueError as exc:
                    _skip(self._entry_key(id), f"vector: {exc}")
        if stale:
            await self._client.zrem(ns_key, *stale)
        # Read whole entries best first; one that vanished since the vectors were read is passed.
        while (found := best_match(candidates, vector, threshold)) is not None:
            entry = await self.get(found[0].id)
            if entry is not None and entry.vector is not None:
                return entry, found[1]
            candidates.remove(found[0])
        return None

    async def put(self, entry: Entry) -> None:
        key = self._entry_key(entry.id)
        ns_key = self._namespace_key(entry.namespace)
        mapping: dict[FieldT, EncodableT] = {
            b"answer": entry.answer,
            b"namespace": entry.namespace.encode(),
            b"vector": b"" if entry.vector is None else encode_vector(entry.vector),
            b"model": entry.model.encode(),
            b"query": entry.query.encode(),
            b"created": repr(entry.created).encode(),
        }
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(key)  # a replaced entry loses its old ttl with its old fields
            pipe.hset(key, mapping=mapping)
            pipe.zadd(ns_key, {entry.id: entry.created})
            pipe.zremrangebyrank(ns_key, 0, -self._max_per_namespace - 1)
            pipe.zadd(self._all, {entry.id: entry.created})
            if self._ttl_s is not None:
                pipe.zremrangebyscore(self._all, "-inf", f"({self._clock() - self._ttl_s!r}")
            if self._ttl_ms is not None:
                pipe.pexpire(key, self._ttl_ms)
                pipe.pexpire(ns_key, self._ttl_ms)
            await pipe.execute()

    async def delete(self, id: str) -> bool:
        key = self._entry_key(id)
        namespace = await self._client.hget(key, "namespace")
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.zrem(self._all, id)
            if namespace is not None:
                pipe.zrem(self._namespace_key(_text(namespace)), id)
            deleted, *_ = await pipe.execute()
        return bool(deleted)

    async def flush(self) -> int:
        """Deletes every key under the prefix (SCAN, never FLUSHDB: the database may hold other
        applications' keys); returns how many entry hashes it deleted."""
        entry_prefix = self._entry_key("").encode()
        removed = 0
        batch: list[bytes] = []
        async for key in self._client.scan_iter(match=_glob_escape(self._prefix) + "*",
                                                count=_BATCH):
            batch.append(key)
            if len(batch) >= _BATCH:
                removed += await self._unlink(batch, entry_prefix)
                batch = []
        if batch:
            removed += await self._unlink(batch, entry_prefix)
        return removed

    async def entries(self, limit: int | None = None) -> list[Entry]:
        if limit is not None and limit <= 0:
            return []
        found: list[Entry] = []
        seen: set[str] = set()
        stale: list[str] = []
        start = 0
        while limit is None or len(found) < limit:
            ids = [_text(raw) for raw in
                   await self._client.zrange(self._all, start, start + _BATCH - 1, desc=True)]
            if not ids:
                break
            start += len(ids)
            async with self._client.pipeline(transaction=False) as pipe:
                for id in ids:
                    pipe.hgetall(self._entry_key(id))
                rows: list[dict[bytes, bytes]] = await pipe.execute()
            for id, fields in zip(ids, rows, strict=True):
                if not fields:
                    stale.append(id)
                elif id not in seen and (entry := self._decode(id, fields)) is not None:
                    seen.add(id)  # a put during the walk shifts ranks: an id may come twice
                    found.append(entry)
        if stale:
            await self._client.zrem(self._all, *stale)
        return found if limit is None else found[:limit]

    async def count(self) -> int:
        live = 0
        stale: list[bytes] = []
        start = 0
        while ids := cast(list[bytes],
                          await self._client.zrange(self._all, start, start + _BATCH - 1)):
            start += len(ids)
            async with self._client.pipeline(transaction=False) as pipe:
                for raw in ids:
                    pipe.exists(self._entry_key(_text(raw)))
                exists: list[int] = await pipe.execute()
            live += sum(exists)
            stale.extend(raw for raw, there in zip(ids, exists, strict=True) if not there)
        if stale:
            await self._client.zrem(self._all, *stale)
        return live

    async def bump(self, counter: str) -> None:
        check_counter(counter)
        await self._client.hincrby(self._counters, counter, 1)

    async def counters(self) -> dict[str, int]:
        values = await self._client.hmget(self._counters, list(COUNTERS))
        return {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}

    async def close(self) -> None:
        await self._client.aclose()

    def _entry_key(self, id: str) -> str:
        return f"{self._prefix}e:{id}"

    def _namespace_key(self, namespace: str) -> str:
        return f"{self._prefix}ns:{namespace}"

    def _decode(self, id: str, fields: Mapping[bytes, bytes]) -> Entry | None:
        try:
            return _decode_entry(id, fields)
        except ValueError as exc:
            _skip(self._entry_key(id), str(exc))
            return None

    async def _unlink(self, keys: list[bytes], entry_prefix: bytes) -> int:
        await self._client.unlink(*keys)
        return sum(1 for key in keys if key.startswith(entry_prefix))


def _decode_entry(id: str, fields: Mapping[bytes, bytes]) -> Entry:
    """The entry a hash holds; ValueError naming the field that is missing or malformed."""
    missing = [name.decode() for name in _FIELDS if name not in fields]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    try:
        namespace, model, query, created = (
            fields[name].decode() for name in (b"namespace", b"model", b"query", b"created"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"a text field is not UTF-8: {exc}") from exc
    try:
        vector = decode_vector(fields[b"vector"]) if fields[b"vector"] else None
    except ValueError as exc:
        raise ValueError(f"vector: {exc}") from exc
    try:
        when = float(created)
    except ValueError as exc:
        raise ValueError(f"created is not a number: {created!r}") from exc
    return Entry(id=id, namespace=namespace, vector=vector, answer=fields[b"answer"],
                 model=model, query=query, created=when)


def _probe(id: str, vector: Vector) -> Entry:
    """A stand-in entry carrying only what `best_match` compares, before the whole hash is read."""
    return Entry(id=id, namespace="", vector=vector, answer=b"", model="", query="", created=0.0)


def _skip(key: str, reason: str) -> None:
    log.warning("skipping cache entry %s that does not decode: %s", key, reason)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def _glob_escape(text: str) -> str:
    """`text` as a literal in a Redis MATCH pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)
