"""Where cached answers live: `Entry`, the `CacheStore` protocol, and the in-process `MemoryStore`.

A store keeps entries by id (the exact tier) and, per namespace, the newest `max_per_namespace`
ids for the semantic tier: `nearest` compares a query vector with those only, so a namespace that
sees thousands of questions costs a bounded scan. Entries whose `vector` is None are exact-only and
never a semantic match. `answer` is opaque bytes to every store.

`MemoryStore` is one replica's cache: LRU over at most `max_entries` entries, each gone `ttl_s`
after it was put (counted on the injected clock, the way Redis counts EXPIRE from the write).
The shared store across replicas is `RedisStore` (gateway/cache/redis_store.py).

A namespace's vectors are kept in the index its `index` maker makes (gateway/cache/vector_index.py:
sparse or dense). `nearest` takes an `admits` check (the near-miss guard): a candidate it refuses
is passed over for the next best. Stores also keep the newest `SHADOW_RECORDS` shadow records
(gateway/cache/shadow.py), opaque bytes, for `kvgate cache shadow-report`.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.cache.index import SemanticIndex
from gateway.cache.vector_index import IndexMaker, VectorIndex
from gateway.cache.vectors import Vector

COUNTERS = ("exact", "semantic", "miss", "store")
SHADOW_RECORDS = 10_000  # the newest shadow records a store keeps
Admits = Callable[["Entry"], bool]


@dataclass(frozen=True, slots=True)
class Entry:
    id: str                 # CacheKey.id
    namespace: str          # CacheKey.namespace
    vector: Vector | None   # None: exact tier only
    answer: bytes           # CachedAnswer.to_bytes(); opaque to stores
    model: str
    query: str              # the embedded text, "" when none (shown by `kvgate cache ls/show`)
    created: float          # wall-clock seconds since the epoch


class CacheStore(Protocol):
    async def get(self, id: str, *, vector: bool = True) -> Entry | None:
        """The entry stored under `id`; with `vector=False` (the exact tier, which serves the
        answer and never compares vectors) a store may leave the vector unread (None)."""
        ...

    async def nearest(self, namespace: str, vector: Vector, threshold: float,
                      admits: Admits | None = None) -> tuple[Entry, float] | None:
        """The best cosine >= threshold among the namespace's newest max_per_namespace entries
        (the newer one on a tie) that `admits` accepts, or None."""
        ...

    async def record_shadow(self, record: bytes) -> None:
        """Keeps one shadow record, forgetting the oldest past SHADOW_RECORDS."""
        ...

    async def shadow_records(self) -> list[bytes]:
        """The shadow records kept, newest first."""
        ...

    async def put(self, entry: Entry) -> None:
        """Stores `entry`, replacing any entry with the same id."""
        ...

    async def delete(self, id: str) -> bool: ...

    async def flush(self) -> int:
        """Removes every entry (and the counters); returns how many entries it removed."""
        ...

    async def entries(self, limit: int | None = None) -> list[Entry]:
        """Live entries, newest `created` first."""
        ...

    async def count(self) -> int: ...

    async def bump(self, counter: str, by: int = 1) -> None:
        """Adds `by` to `counter`, one of COUNTERS (ValueError otherwise)."""
        ...

    async def counters(self) -> dict[str, int]:
        """Every name in COUNTERS, 0 for one never bumped."""
        ...

    async def close(self) -> None: ...


def check_counter(counter: str) -> None:
    if counter not in COUNTERS:
        raise ValueError(f"unknown cache counter {counter!r}; one of {', '.join(COUNTERS)}")


def check_limits(ttl_s: float | None, max_per_namespace: int) -> None:
    """The settings every store shares; ValueError naming the bad one."""
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be positive or None, not {ttl_s!r}")
    if max_per_namespace < 1:
        raise ValueError(f"max_per_namespace must be at least 1, not {max_per_namespace!r}")


class MemoryStore:
    """One process's cache. Memory stays bounded: at most `max_entries` entries, each namespace
    indexes at most `max_per_namespace` of them, and expired entries are dropped as the clock
    passes them, not only when looked up."""

    def __init__(self, *, max_entries: int, ttl_s: float | None, max_per_namespace: int = 256,
                 clock: Callable[[], float] = time.time,
                 index: IndexMaker = SemanticIndex) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries!r}")
        check_limits(ttl_s, max_per_namespace)
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._max_per_namespace = max_per_namespace
        self._clock = clock
        self._entries: OrderedDict[str, Entry] = OrderedDict()   # least recently used first
        self._expires: OrderedDict[str, float] = OrderedDict()   # put order: soonest first
        self._namespaces: dict[str, dict[str, float]] = {}       # namespace -> {id: created}
        self._indexes: dict[str, VectorIndex] = {}               # namespace -> its vectors
        self._index = index
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._shadow: deque[bytes] = deque(maxlen=SHADOW_RECORDS)  # newest last

    async def get(self, id: str, *, vector: bool = True) -> Entry | None:
        now = self._sweep()
        entry = self._entries.get(id)
        if entry is None or self._expired(id, now):
            return None
        self._entries.move_to_end(id)
        return entry

    async def nearest(self, namespace: str, vector: Vector, threshold: float,
                      admits: Admits | None = None) -> tuple[Entry, float] | None:
        now = self._sweep()
        index = self._indexes.get(namespace)
        if index is None:
            return None
        entries = self._entries

        def skip(id: str) -> bool:
            return self._expired(id, now) or (admits is not None and not admits(entries[id]))

        found = index.best(vector, threshold, skip=skip)
        if found is None:
            return None
        self._entries.move_to_end(found[0])  # a semantic hit is a use too
        return self._entries[found[0]], found[1]

    async def put(self, entry: Entry) -> None:
        now = self._sweep()
        self._remove(entry.id)
        self._entries[entry.id] = entry
        if self._ttl_s is not None:
            self._expires[entry.id] = now + self._ttl_s
        index = self._namespaces.setdefault(entry.namespace, {})
        index[entry.id] = entry.created
        if entry.vector:
            vectors = self._indexes.get(entry.namespace)
            if vectors is None:
                vectors = self._indexes[entry.namespace] = self._index()
            vectors.add(entry.id, entry.vector, entry.created)
        if len(index) > self._max_per_namespace:
            # Only the index forgets the oldest: the entry still answers exact lookups.
            oldest = min(index, key=lambda id: (index[id], id))
            del index[oldest]
            self._unindex(entry.namespace, oldest)
        while len(self._entries) > self._max_entries:
            self._remove(next(iter(self._entries)))

    async def delete(self, id: str) -> bool:
        now = self._sweep()
        live = id in self._entries and not self._expired(id, now)
        self._remove(id)
        return live

    async def flush(self) -> int:
        removed = await self.count()
        self._entries.clear()
        self._expires.clear()
        self._namespaces.clear()
        self._indexes.clear()
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._shadow.clear()
        return removed

    async def record_shadow(self, record: bytes) -> None:
        self._shadow.append(record)

    async def shadow_records(self) -> list[bytes]:
        return list(reversed(self._shadow))

    async def entries(self, limit: int | None = None) -> list[Entry]:
        now = self._sweep()
        live = [entry for id, entry in self._entries.items() if not self._expired(id, now)]
        live.sort(key=lambda entry: (entry.created, entry.id), reverse=True)
        return live if limit is None else live[:max(limit, 0)]

    async def count(self) -> int:
        now = self._sweep()
        return sum(1 for id in self._entries if not self._expired(id, now))

    async def bump(self, counter: str, by: int = 1) -> None:
        check_counter(counter)
        self._counters[counter] += by

    async def counters(self) -> dict[str, int]:
        return dict(self._counters)

    async def close(self) -> None:
        """Nothing to release: the entries go with the process."""

    def _expired(self, id: str, now: float) -> bool:
        expires = self._expires.get(id)
        return expires is not None and now >= expires

    def _sweep(self) -> float:
        """Drops the entries whose time ran out; returns the clock's reading. `_expires` is in put
        order, which is expiry order while the clock runs forward; if it stepped back, the check
        on each read still hides what the sweep left."""
        now = self._clock()
        while self._expires:
            id, expires = next(iter(self._expires.items()))
            if now < expires:
                break
            self._remove(id)
        return now

    def _remove(self, id: str) -> None:
        entry = self._entries.pop(id, None)
        self._expires.pop(id, None)
        if entry is None:
            return
        index = self._namespaces.get(entry.namespace)
        if index is not None:
            index.pop(id, None)
            if not index:
                del self._namespaces[entry.namespace]
        self._unindex(entry.namespace, id)

    def _unindex(self, namespace: str, id: str) -> None:
        vectors = self._indexes.get(namespace)
        if vectors is not None:
            vectors.discard(id)
            if not len(vectors):
                del self._indexes[namespace]
