"""`RedisStore`: the cache shared by every gateway replica, over redis.asyncio.

Layout, every key under `prefix` (default "kvgate:cache:"):

- `{prefix}e:{id}`: a hash {answer, namespace, vector, model, query, created}; `vector` is
  `encode_vector` bytes, or empty for an exact-only entry; expires `ttl_s` after its put.
- `{prefix}ns:{namespace}`: a sorted set of ids scored by `created`, trimmed to the newest
  `max_per_namespace` and expiring with the newest entry's ttl: what `nearest` scans.
- `{prefix}nv:{namespace}`: a hash of the namespace's vectors by id, expiring with it; a put
  drops the vectors of the ids its trim drops. Each process keeps the vectors it has read in a
  bounded local `SemanticIndex` per namespace, so a lookup reads only the vectors it has not seen.
- `{prefix}all`: a sorted set of every id by `created`, for `entries`, `count` and `flush`. Each
  put drops the ids created more than `ttl_s` before now (the gateway stores an answer as it is
  created, so their hashes have expired), which keeps it bounded without anyone listing it; an
  entry imported with an older `created` is still served but may leave the listing early.
  `entries` and `count` drop the ids of hashes deleted or expired.
- `{prefix}counters`: a hash of COUNTERS.
- `{prefix}shadow`: a list of shadow records, newest first, trimmed to SHADOW_RECORDS.

A namespace's local index is the one the `index` maker makes (sparse or dense vectors,
gateway/cache/vector_index.py). A candidate `nearest`'s `admits` refuses (the near-miss guard)
costs the round trip that read it; the next best is read after it.

Redis errors propagate as redis exceptions: the caller (ResponseCache) fails open. A hash that
does not decode (a field missing or malformed, e.g. written by another version) is skipped as if
absent (`count`, which reads no fields, still counts it) and logged, never raised: one bad entry
must not turn the whole cache off, and the next `put` of that id replaces it.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as redis
from redis.typing import EncodableT, FieldT

from gateway.cache.index import SemanticIndex
from gateway.cache.store import (
    COUNTERS,
    SHADOW_RECORDS,
    Admits,
    Entry,
    check_counter,
    check_limits,
)
from gateway.cache.vector_index import IndexMaker, VectorIndex
from gateway.cache.vectors import Vector, decode_vector, encode_vector

log = logging.getLogger("kvgate.cache")

_FIELDS = (b"answer", b"namespace", b"vector", b"model", b"query", b"created")
_ANSWER_FIELDS = [name for name in _FIELDS if name != b"vector"]  # what an exact hit reads
_BATCH = 256  # ids read per round trip by entries, count and flush
MIRROR_VECTORS = 16_384  # vectors kept in this process for semantic lookups (~1 KB each)
FULL_SYNC_S = 30.0  # a namespace's local index is read whole this often (deletions, trims)
CLOCK_SKEW_S = 10.0  # an incremental read goes this far back before the newest id it saw


@dataclass(slots=True)
class _Mirror:
    index: VectorIndex
    newest: float = float("-inf")  # the highest `created` read
    synced_at: float = float("-inf")  # monotonic time of the last whole read


class RedisStore:
    """The shared store. `client` must return bytes (decode_responses=False, as `from_url`
    makes it): answers and vectors are binary."""

    def __init__(self, client: redis.Redis, *, prefix: str = "kvgate:cache:",
                 ttl_s: float | None, max_per_namespace: int = 256,
                 clock: Callable[[], float] = time.time,
                 mirror_vectors: int = MIRROR_VECTORS,
                 index: IndexMaker = SemanticIndex) -> None:
        check_limits(ttl_s, max_per_namespace)
        self._client = client
        self._index = index
        # Namespaces' vectors as read from Redis, least recently used first, at most about
        # `mirror_vectors` of them (a namespace is kept whole).
        self._mirror: OrderedDict[str, _Mirror] = OrderedDict()
        self._monotonic = time.monotonic
        self._mirror_limit = mirror_vectors
        self._mirrored = 0
        self._clock = clock  # wall-clock seconds: the `all` set's scores
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._ttl_ms = None if ttl_s is None else max(1, round(ttl_s * 1000))
        self._max_per_namespace = max_per_namespace
        self._all = f"{prefix}all"
        self._counters = f"{prefix}counters"
        self._shadow = f"{prefix}shadow"

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "kvgate:cache:", ttl_s: float | None,
                 max_per_namespace: int = 256, clock: Callable[[], float] = time.time,
                 index: IndexMaker = SemanticIndex, **client_options: Any) -> RedisStore:
        """`client_options` go to redis-py (e.g. socket_timeout, socket_connect_timeout);
        ValueError for a URL redis-py cannot read."""
        check_limits(ttl_s, max_per_namespace)  # before there is a client to close
        client = redis.Redis.from_url(url, decode_responses=False, **client_options)
        return cls(client, prefix=prefix, ttl_s=ttl_s, max_per_namespace=max_per_namespace,
                   clock=clock, index=index)

    async def get(self, id: str, *, vector: bool = True) -> Entry | None:
        """`vector=False` reads every field but the vector (a dense one is 1.5 KB to send and
        decode), and the entry's vector is None."""
        if vector:
            fields = cast(dict[bytes, bytes], await self._client.hgetall(self._entry_key(id)))
            return self._decode(id, fields) if fields else None
        values = cast(list[bytes | None], await self._client.hmget(self._entry_key(id),
                                                                   _ANSWER_FIELDS))
        if all(value is None for value in values):
            return None
        found = {name: value for name, value in zip(_ANSWER_FIELDS, values, strict=True)
                 if value is not None}
        return self._decode(id, {**found, b"vector": b""})

    async def nearest(self, namespace: str, vector: Vector, threshold: float,
                      admits: Admits | None = None) -> tuple[Entry, float] | None:
        """The search runs on this process's `SemanticIndex` of the namespace. Bringing it up to
        date costs one small round trip, for the ids stored since the last lookup (all of them
        every FULL_SYNC_S), and a second only for vectors not read before: an id is the hash of a
        whole request, so its vector never changes. The best match is read whole in a third;
        one deleted, expired or moved since is dropped and the next best read."""
        index = await self._synced(namespace)
        if index is None:
            return None
        refused: set[str] = set()
        while (found := index.best(vector, threshold, skip=refused.__contains__)) is not None:
            entry = await self.get(found[0])
            if entry is not None and entry.vector is not None and entry.namespace == namespace:
                if admits is None or admits(entry):
                    return entry, found[1]
                refused.add(found[0])
                continue
            if entry is None:  # its hash expired or was deleted: drop it from the namespace
                async with self._client.pipeline(transaction=False) as pipe:
                    pipe.zrem(self._namespace_key(namespace), found[0])
                    pipe.hdel(self._vectors_key(namespace), found[0])
                    await pipe.execute()
            self._mirrored -= 1
            index.discard(found[0])
        return None

    async def _synced(self, namespace: str) -> VectorIndex | None:
        """The local index of `namespace` with every id stored there (None when it has none)."""
        mirror = self._mirror.pop(namespace, None)
        now = self._monotonic()
        ns_key = self._namespace_key(namespace)
        full = mirror is None or now - mirror.synced_at >= FULL_SYNC_S
        if full:
            pairs = await self._client.zrange(
                ns_key, 0, self._max_per_namespace - 1, desc=True, withscores=True)
        else:  # the recent ids only; CLOCK_SKEW_S back, for replicas whose clocks lag ours
            assert mirror is not None
            pairs = await self._client.zrangebyscore(
                ns_key, mirror.newest - CLOCK_SKEW_S, "+inf", withscores=True)
        ranks = {_text(raw): rank for raw, rank in cast(list[tuple[bytes, float]], pairs)}
        if mirror is None:
            mirror = _Mirror(self._index())
        before = len(mirror.index)
        if full:
            if not ranks:
                self._mirrored -= before
                return None
            mirror.synced_at = now
            for id in [id for id in mirror.index if id not in ranks]:
                mirror.index.discard(id)
        await self._load(namespace, mirror.index, ranks)
        while len(mirror.index) > self._max_per_namespace:  # only the newest are searched
            mirror.index.discard(min(mirror.index, key=mirror.index.rank))
        if ranks:
            mirror.newest = max(mirror.newest, *ranks.values())
        self._mirror[namespace] = mirror  # the most recently used
        self._mirrored += len(mirror.index) - before
        while self._mirrored > self._mirror_limit and len(self._mirror) > 1:
            _, evicted = self._mirror.popitem(last=False)
            self._mirrored -= len(evicted.index)
        return mirror.index

    async def _load(self, namespace: str, index: VectorIndex, ranks: dict[str, float]) -> None:
        """Adds the ids of `ranks` the index lacks, with their vectors."""
        missing = [id for id in ranks if id not in index]
        if not missing:
            return
        raw_vectors = cast(list[bytes | None], await self._client.hmget(
            self._vectors_key(namespace), missing))
        for id, raw in zip(missing, raw_vectors, strict=True):
            try:
                loaded = decode_vector(raw) if raw else {}  # {}: an exact-only entry
            except ValueError as exc:
                _skip(self._entry_key(id), f"vector: {exc}")
                loaded = {}
            index.add(id, loaded, ranks[id])

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
        nv_key = self._vectors_key(entry.namespace)
        old = await self._client.hget(key, "namespace")  # a replaced entry's, if it moved
        # The ids the trim below will drop (this put makes one more), whose vectors go with them.
        trimmed = cast(list[bytes], await self._client.zrange(
            ns_key, 0, -self._max_per_namespace, desc=False))
        if entry.id.encode() in trimmed:
            trimmed.remove(entry.id.encode())
        async with self._client.pipeline(transaction=True) as pipe:
            if old is not None and _text(old) != entry.namespace:
                pipe.zrem(self._namespace_key(_text(old)), entry.id)
                pipe.hdel(self._vectors_key(_text(old)), entry.id)
            pipe.delete(key)  # a replaced entry loses its old ttl with its old fields
            pipe.hset(key, mapping=mapping)
            if entry.vector is not None:
                pipe.hset(nv_key, entry.id, mapping[b"vector"])
            else:
                pipe.hdel(nv_key, entry.id)
            if trimmed:
                pipe.hdel(nv_key, *trimmed)
            pipe.zadd(ns_key, {entry.id: entry.created})
            pipe.zremrangebyrank(ns_key, 0, -self._max_per_namespace - 1)
            pipe.zadd(self._all, {entry.id: entry.created})
            if self._ttl_s is not None:
                pipe.zremrangebyscore(self._all, "-inf", f"({self._clock() - self._ttl_s!r}")
            if self._ttl_ms is not None:
                pipe.pexpire(key, self._ttl_ms)
                pipe.pexpire(ns_key, self._ttl_ms)
                if entry.vector is not None:
                    pipe.pexpire(nv_key, self._ttl_ms)
            await pipe.execute()
        mirror = self._mirror.get(entry.namespace)
        if mirror is not None and entry.id not in mirror.index:  # no need to read it back
            mirror.index.add(entry.id, entry.vector or {}, entry.created)
            self._mirrored += 1

    async def delete(self, id: str) -> bool:
        key = self._entry_key(id)
        namespace = await self._client.hget(key, "namespace")
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.zrem(self._all, id)
            if namespace is not None:
                pipe.zrem(self._namespace_key(_text(namespace)), id)
                pipe.hdel(self._vectors_key(_text(namespace)), id)
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

    async def bump(self, counter: str, by: int = 1) -> None:
        check_counter(counter)
        await self._client.hincrby(self._counters, counter, by)

    async def counters(self) -> dict[str, int]:
        values = await self._client.hmget(self._counters, list(COUNTERS))
        return {name: int(value or 0) for name, value in zip(COUNTERS, values, strict=True)}

    async def record_shadow(self, record: bytes) -> None:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.lpush(self._shadow, record)
            pipe.ltrim(self._shadow, 0, SHADOW_RECORDS - 1)
            await pipe.execute()

    async def shadow_records(self) -> list[bytes]:
        return cast(list[bytes], await self._client.lrange(self._shadow, 0, -1))

    async def close(self) -> None:
        await self._client.aclose()

    def _entry_key(self, id: str) -> str:
        return f"{self._prefix}e:{id}"

    def _namespace_key(self, namespace: str) -> str:
        return f"{self._prefix}ns:{namespace}"

    def _vectors_key(self, namespace: str) -> str:
        return f"{self._prefix}nv:{namespace}"

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


def _skip(key: str, reason: str) -> None:
    log.warning("skipping cache entry %s that does not decode: %s", key, reason)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def _glob_escape(text: str) -> str:
    """`text` as a literal in a Redis MATCH pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)
