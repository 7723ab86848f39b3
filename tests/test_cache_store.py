"""Cache stores: one table of behaviours that `MemoryStore` and `RedisStore` both keep, then what is
particular to each (LRU and the injected clock; Redis's key layout, its sharing across replicas and
clients, and entries that do not decode).

Redis runs as a real redis-server this test starts on loopback (tests/redis_server.py). Vectors
here hold values float32 keeps exactly, so an entry read back from Redis equals the one put.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

import pytest
import redis.asyncio as redis

from gateway.cache.redis_store import RedisStore
from gateway.cache.store import COUNTERS, CacheStore, Entry, MemoryStore
from gateway.cache.vectors import Vector, encode_vector
from tests.redis_server import running_redis

A: Vector = {1: 1.0}
B: Vector = {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.5}   # cosine(A, B) = 0.5
C: Vector = {1: 0.5, 2: 0.5, 3: 0.5, 5: 0.5}   # cosine(B, C) = 0.75, cosine(A, C) = 0.5
FAR: Vector = {9: 1.0}                         # cosine 0 with all of the above
EXPIRY_DEADLINE_S = 10.0


def entry(id: str, *, namespace: str = "ns", vector: Vector | None = A, created: float = 1000.0,
          answer: bytes | None = None) -> Entry:
    return Entry(id=id, namespace=namespace, vector=vector,
                 answer=answer if answer is not None else f"answer {id}".encode(),
                 model="m", query=f"question {id}", created=created)


class StoreMaker(Protocol):
    def __call__(self, *, ttl_s: float | None = None, max_per_namespace: int = 256
                 ) -> CacheStore: ...


@dataclass
class Backend:
    """One kind of store for the shared table: `make` builds a store (every Redis one a new
    client over the same server and prefix, like another replica); `outlive` waits (Redis) or
    moves the clock (memory) until `id`'s ttl has passed."""
    make: StoreMaker
    ttl_s: float
    outlive: Callable[[CacheStore, str], Awaitable[None]]


@dataclass
class FakeClock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def until_gone(store: CacheStore, id: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXPIRY_DEADLINE_S
    while await store.get(id) is not None:
        assert loop.time() < deadline, f"{id} still there {EXPIRY_DEADLINE_S} s after its ttl"
        await asyncio.sleep(0.05)


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = FakeClock()

        def make_memory(*, ttl_s: float | None = None, max_per_namespace: int = 256
                        ) -> CacheStore:
            return MemoryStore(max_entries=1000, ttl_s=ttl_s, max_per_namespace=max_per_namespace,
                               clock=clock)

        async def advance(store: CacheStore, id: str) -> None:
            clock.now += 60.0

        yield Backend(make_memory, ttl_s=60.0, outlive=advance)
        return
    async with running_redis() as url:
        made: list[CacheStore] = []

        def make_redis(*, ttl_s: float | None = None, max_per_namespace: int = 256
                       ) -> CacheStore:
            made.append(RedisStore.from_url(url, ttl_s=ttl_s, max_per_namespace=max_per_namespace))
            return made[-1]

        try:
            yield Backend(make_redis, ttl_s=1.0, outlive=until_gone)
        finally:
            for store in made:
                await store.close()


# The shared table: each behaviour gets a Backend and states one rule.

async def get_returns_the_entry_put(b: Backend) -> None:
    store = b.make()
    stored = Entry(id="k1", namespace="ns", vector=B, answer=b"\x00\xff{binary}", model="llama-3",
                   query="qu'est-ce que c'est ? \u00e9\u2603", created=1.7e9 + 0.125)
    await store.put(stored)
    assert await store.get("k1") == stored
    assert await store.get("unknown") is None


async def get_without_the_vector_returns_every_other_field(b: Backend) -> None:
    store = b.make()
    stored = entry("k", vector=B)
    await store.put(stored)
    found = await store.get("k", vector=False)
    assert found is not None and found.vector in (None, B)  # a store may skip reading it
    assert replace(found, vector=B) == stored
    assert await store.get("unknown", vector=False) is None


async def exact_only_entry_keeps_vector_none(b: Backend) -> None:
    store = b.make()
    await store.put(entry("none", vector=None))
    await store.put(entry("empty", vector={}))
    assert (await store.get("none")) == entry("none", vector=None)
    assert (await store.get("empty")) == entry("empty", vector={})


async def put_replaces_the_entry_with_the_same_id(b: Backend) -> None:
    store = b.make()
    await store.put(entry("k", answer=b"old", created=1.0))
    await store.put(entry("k", answer=b"new", created=2.0))
    assert await store.get("k") == entry("k", answer=b"new", created=2.0)
    assert await store.count() == 1
    assert [e.answer for e in await store.entries()] == [b"new"]


async def put_under_a_new_namespace_moves_the_entry(b: Backend) -> None:
    store = b.make()
    await store.put(entry("k", namespace="old"))
    await store.put(entry("k", namespace="new"))
    assert await store.nearest("old", A, 0.9) is None
    found = await store.nearest("new", A, 0.9)
    assert found is not None and found[0].id == "k"


async def put_of_an_exact_only_entry_leaves_the_semantic_tier(b: Backend) -> None:
    store = b.make()
    await store.put(entry("k", vector=C))
    await store.put(entry("k", vector=None))
    assert await store.get("k") == entry("k", vector=None)
    assert await store.nearest("ns", C, 0.0) is None


async def nearest_returns_the_most_similar_at_or_above_threshold(b: Backend) -> None:
    store = b.make()
    await store.put(entry("b", vector=B, created=1.0))
    await store.put(entry("c", vector=C, created=2.0))
    await store.put(entry("far", vector=FAR, created=3.0))
    assert await store.nearest("ns", B, 0.7) == (entry("b", vector=B, created=1.0), 1.0)
    assert await store.nearest("ns", C, 0.7) == (entry("c", vector=C, created=2.0), 1.0)
    assert await store.nearest("ns", A, 0.5) == (entry("c", vector=C, created=2.0), 0.5)


async def nearest_is_none_below_threshold(b: Backend) -> None:
    store = b.make()
    await store.put(entry("b", vector=B))
    assert await store.nearest("ns", A, 0.51) is None


async def nearest_prefers_the_newer_of_equals(b: Backend) -> None:
    store = b.make()
    await store.put(entry("old", created=1.0))
    await store.put(entry("new", created=2.0))
    found = await store.nearest("ns", A, 0.9)
    assert found is not None and found[0].id == "new"


async def nearest_searches_only_its_namespace(b: Backend) -> None:
    store = b.make()
    await store.put(entry("here", namespace="mine", vector=B))
    await store.put(entry("there", namespace="theirs", vector=A))
    found = await store.nearest("mine", A, 0.1)
    assert found is not None and found[0].id == "here"
    assert await store.nearest("nobody", A, 0.1) is None


async def nearest_ignores_exact_only_entries(b: Backend) -> None:
    store = b.make()
    await store.put(entry("exact", vector=None, created=2.0))
    assert await store.nearest("ns", A, 0.0) is None
    await store.put(entry("vec", vector=B, created=1.0))
    found = await store.nearest("ns", A, 0.0)
    assert found is not None and found[0].id == "vec"


async def nearest_searches_only_the_newest_max_per_namespace(b: Backend) -> None:
    store = b.make(max_per_namespace=2)
    await store.put(entry("oldest", vector=A, created=1.0))
    await store.put(entry("mid", vector=B, created=2.0))
    await store.put(entry("newest", vector=C, created=3.0))
    found = await store.nearest("ns", A, 0.1)
    assert found is not None and found[0].id in {"mid", "newest"}
    assert await store.nearest("ns", A, 0.9) is None
    assert await store.get("oldest") is not None  # the exact tier still has it


async def delete_removes_the_entry(b: Backend) -> None:
    store = b.make()
    await store.put(entry("k"))
    assert await store.delete("k") is True
    assert await store.get("k") is None
    assert await store.nearest("ns", A, 0.0) is None
    assert (await store.count(), await store.entries()) == (0, [])
    assert await store.delete("k") is False


async def flush_removes_every_entry_and_the_counters(b: Backend) -> None:
    store = b.make()
    for i in range(3):
        await store.put(entry(f"k{i}", created=float(i)))
    await store.bump("miss")
    assert await store.flush() == 3
    assert (await store.count(), await store.entries()) == (0, [])
    assert await store.nearest("ns", A, 0.0) is None
    assert await store.counters() == dict.fromkeys(COUNTERS, 0)
    await store.put(entry("after"))
    assert await store.count() == 1


async def entries_come_newest_first_up_to_limit(b: Backend) -> None:
    store = b.make()
    for id, created in [("b", 2.0), ("a", 1.0), ("c", 3.0)]:
        await store.put(entry(id, created=created, namespace=f"ns-{id}"))
    assert [e.id for e in await store.entries()] == ["c", "b", "a"]
    assert [e.id for e in await store.entries(limit=2)] == ["c", "b"]
    assert await store.entries(limit=0) == []
    assert (await store.entries(limit=1))[0] == entry("c", created=3.0, namespace="ns-c")


async def count_counts_entries(b: Backend) -> None:
    store = b.make()
    assert await store.count() == 0
    await store.put(entry("a"))
    await store.put(entry("b"))
    await store.put(entry("a"))
    assert await store.count() == 2


async def counters_start_at_zero_and_bump_adds_one(b: Backend) -> None:
    store = b.make()
    assert await store.counters() == dict.fromkeys(COUNTERS, 0)
    await store.bump("exact")
    await store.bump("exact")
    await store.bump("store")
    assert await store.counters() == {"exact": 2, "semantic": 0, "miss": 0, "store": 1}
    await store.bump("miss", 5)
    assert (await store.counters())["miss"] == 5
    with pytest.raises(ValueError, match="unknown cache counter 'hit'"):
        await store.bump("hit")


async def an_entry_is_gone_after_its_ttl(b: Backend) -> None:
    store = b.make(ttl_s=b.ttl_s)
    await store.put(entry("k"))
    assert await store.get("k") is not None
    await b.outlive(store, "k")
    assert await store.get("k") is None
    assert await store.nearest("ns", A, 0.0) is None
    assert (await store.count(), await store.entries()) == (0, [])


async def nearest_passes_over_a_candidate_admits_refuses(b: Backend) -> None:
    store = b.make()
    await store.put(entry("b", vector=B, created=1.0))
    await store.put(entry("c", vector=C, created=2.0))
    # C is the best match for B's neighbour C, B the next: refusing C finds B.
    found = await store.nearest("ns", C, 0.5, lambda candidate: candidate.id != "c")
    assert found == (entry("b", vector=B, created=1.0), pytest.approx(0.75))
    assert await store.nearest("ns", C, 0.5, lambda candidate: False) is None


async def shadow_records_are_kept_newest_first_and_flushed(b: Backend) -> None:
    store = b.make()
    assert await store.shadow_records() == []
    for record in (b"first", b"second"):
        await store.record_shadow(record)
    assert await store.shadow_records() == [b"second", b"first"]
    await store.flush()
    assert await store.shadow_records() == []


SHARED = [
    pytest.param(nearest_passes_over_a_candidate_admits_refuses,
                 id="nearest passes over a candidate admits refuses for the next best"),
    pytest.param(shadow_records_are_kept_newest_first_and_flushed,
                 id="shadow records are kept newest first, and flushed with the rest"),
    pytest.param(get_returns_the_entry_put, id="get returns the entry put, None for others"),
    pytest.param(get_without_the_vector_returns_every_other_field,
                 id="get without the vector returns every other field"),
    pytest.param(exact_only_entry_keeps_vector_none,
                 id="an exact-only entry keeps vector None, distinct from an empty vector"),
    pytest.param(put_replaces_the_entry_with_the_same_id, id="put replaces the same id"),
    pytest.param(put_under_a_new_namespace_moves_the_entry,
                 id="put under a new namespace leaves the old one"),
    pytest.param(put_of_an_exact_only_entry_leaves_the_semantic_tier,
                 id="put of an exact-only entry over a semantic one leaves the semantic tier"),
    pytest.param(nearest_returns_the_most_similar_at_or_above_threshold,
                 id="nearest returns the most similar at or above threshold with its cosine"),
    pytest.param(nearest_is_none_below_threshold, id="nearest is None below threshold"),
    pytest.param(nearest_prefers_the_newer_of_equals, id="nearest prefers the newer of equals"),
    pytest.param(nearest_searches_only_its_namespace, id="nearest searches only its namespace"),
    pytest.param(nearest_ignores_exact_only_entries, id="nearest ignores vector None entries"),
    pytest.param(nearest_searches_only_the_newest_max_per_namespace,
                 id="nearest searches only the newest max_per_namespace"),
    pytest.param(delete_removes_the_entry, id="delete removes the entry, False when absent"),
    pytest.param(flush_removes_every_entry_and_the_counters,
                 id="flush removes every entry and the counters, returns how many"),
    pytest.param(entries_come_newest_first_up_to_limit, id="entries come newest first up to limit"),
    pytest.param(count_counts_entries, id="count counts entries once each"),
    pytest.param(counters_start_at_zero_and_bump_adds_one,
                 id="counters start at zero, bump adds one or by, unknown names are refused"),
    pytest.param(an_entry_is_gone_after_its_ttl, id="an entry is gone after its ttl"),
]


@pytest.mark.parametrize("behaviour", SHARED)
async def test_store(backend: Backend, behaviour: Callable[[Backend], Awaitable[None]]) -> None:
    await behaviour(backend)


# MemoryStore: LRU, the injected clock, bounded memory

async def test_memory_evicts_the_least_recently_used_past_max_entries() -> None:
    store = MemoryStore(max_entries=2, ttl_s=None)
    for id in ("a", "b", "c"):
        await store.put(entry(id))
    assert [await store.get(id) is not None for id in ("a", "b", "c")] == [False, True, True]


@pytest.mark.parametrize(
    ("use", "evicted"),
    [
        pytest.param("get", "b", id="a get hit makes the entry recent"),
        pytest.param("nearest", "b", id="a nearest hit makes the entry recent"),
        pytest.param("entries", "a", id="listing entries does not"),
    ],
)
async def test_memory_recency(use: str, evicted: str) -> None:
    store = MemoryStore(max_entries=2, ttl_s=None)
    await store.put(entry("a", vector=A, created=1.0))
    await store.put(entry("b", vector=B, created=2.0))
    if use == "get":
        await store.get("a")
    elif use == "nearest":
        assert (await store.nearest("ns", A, 0.9) or (None,))[0] == entry("a", created=1.0)
    else:
        await store.entries()
    await store.put(entry("c", vector=FAR, created=3.0))
    assert await store.get(evicted) is None
    assert await store.count() == 2


@pytest.mark.parametrize(
    ("elapsed", "there"),
    [
        pytest.param(9.999, True, id="alive just before ttl"),
        pytest.param(10.0, False, id="gone at ttl"),
        pytest.param(1e6, False, id="gone long after"),
    ],
)
async def test_memory_ttl_counts_from_the_put_on_the_injected_clock(elapsed: float,
                                                                    there: bool) -> None:
    clock = FakeClock(now=5000.0)
    store = MemoryStore(max_entries=10, ttl_s=10.0, clock=clock)
    await store.put(entry("k", created=0.0))  # created long ago: the ttl runs from the put
    clock.now += elapsed
    assert (await store.get("k") is not None) is there
    assert (await store.nearest("ns", A, 0.0) is not None) is there
    assert await store.count() == int(there)


async def test_memory_forgets_expired_and_evicted_entries_whole() -> None:
    """Bounded memory: nothing of an entry stays once it expired or was evicted (white-box)."""
    clock = FakeClock()
    store = MemoryStore(max_entries=5, ttl_s=10.0, max_per_namespace=3, clock=clock)
    for i in range(100):
        await store.put(entry(f"k{i}", namespace=f"ns{i % 7}", created=float(i)))
    assert len(store._entries) == 5
    assert sum(len(index) for index in store._namespaces.values()) <= 5
    clock.now += 10.0
    assert await store.count() == 0
    assert (store._entries, store._expires, store._namespaces) == ({}, {}, {})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"max_entries": 0, "ttl_s": None}, "max_entries", id="max_entries below 1"),
        pytest.param({"max_entries": 1, "ttl_s": 0.0}, "ttl_s", id="ttl_s zero"),
        pytest.param({"max_entries": 1, "ttl_s": None, "max_per_namespace": 0},
                     "max_per_namespace", id="max_per_namespace below 1"),
    ],
)
def test_memory_refuses_bad_limits(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryStore(**kwargs)


# RedisStore: layout, sharing, foreign keys, entries that do not decode

@pytest.fixture
async def redis_url() -> AsyncIterator[str]:
    async with running_redis() as url:
        yield url


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_redis_entries_survive_a_new_client(redis_url: str) -> None:
    """A second gateway replica (its own client) sees what the first stored."""
    first = RedisStore.from_url(redis_url, ttl_s=None)
    await first.put(entry("k", vector=B))
    await first.bump("store")
    await first.close()
    second = RedisStore.from_url(redis_url, ttl_s=None)
    try:
        assert await second.get("k") == entry("k", vector=B)
        assert await second.nearest("ns", B, 0.9) == (entry("k", vector=B), 1.0)
        assert (await second.counters())["store"] == 1
    finally:
        await second.close()


async def test_redis_flush_deletes_only_keys_under_its_prefix(redis_url: str,
                                                              raw: redis.Redis) -> None:
    await raw.set("other:x", b"keep")
    shared = RedisStore(redis.Redis.from_url(redis_url), ttl_s=None)  # "kvgate:cache:"
    globby = RedisStore(redis.Redis.from_url(redis_url), prefix="kv*:", ttl_s=None)
    try:
        await shared.put(entry("theirs"))
        await globby.put(entry("a"))
        await globby.put(entry("b"))
        await globby.bump("miss")
        # "kv*:" is a literal prefix, not a pattern that would match "kvgate:cache:..."
        assert await globby.flush() == 2
        assert sorted(await raw.keys("*")) == [
            b"kvgate:cache:all", b"kvgate:cache:e:theirs", b"kvgate:cache:ns:ns",
            b"kvgate:cache:nv:ns", b"other:x"]
        assert await shared.flush() == 1
        assert await raw.keys("*") == [b"other:x"]
        assert await raw.get("other:x") == b"keep"
    finally:
        await shared.close()
        await globby.close()


async def test_redis_drops_ids_created_over_a_ttl_ago_from_the_listing_on_put(
        redis_url: str, raw: redis.Redis) -> None:
    now = [100.0]
    store = RedisStore.from_url(redis_url, prefix="p:", ttl_s=30.0, clock=lambda: now[0])
    try:
        await store.put(entry("old", namespace="n", created=60.0))
        await store.put(entry("young", namespace="n", created=90.0))
        now[0] = 125.0  # "old" was created 65 s ago, "young" 35 s ago: both past the ttl
        await store.put(entry("new", namespace="n", created=125.0))
        assert await raw.zrange("p:all", 0, -1) == [b"new"]
    finally:
        await store.close()


@pytest.mark.parametrize("ttl_s", [pytest.param(None, id="no ttl"), pytest.param(30.0, id="ttl")])
async def test_redis_key_layout(redis_url: str, raw: redis.Redis, ttl_s: float | None) -> None:
    store = RedisStore.from_url(redis_url, prefix="p:", ttl_s=ttl_s, clock=lambda: 14.0)
    try:
        await store.put(entry("k", namespace="n", vector=B, created=12.5))
        await store.put(entry("x", namespace="n", vector=None, created=13.0))
        await store.bump("semantic")
    finally:
        await store.close()
    assert await raw.hgetall("p:e:k") == {
        b"answer": b"answer k", b"namespace": b"n", b"vector": encode_vector(B), b"model": b"m",
        b"query": b"question k", b"created": b"12.5"}
    assert await raw.hget("p:e:x", "vector") == b""
    assert await raw.zrange("p:ns:n", 0, -1, withscores=True) == [(b"k", 12.5), (b"x", 13.0)]
    assert await raw.zrange("p:all", 0, -1, withscores=True) == [(b"k", 12.5), (b"x", 13.0)]
    assert await raw.hgetall("p:counters") == {b"semantic": b"1"}
    for key in ("p:e:k", "p:ns:n"):
        pttl = await raw.pttl(key)
        assert (pttl == -1) if ttl_s is None else (0 < pttl <= 30_000), (key, pttl)
    assert await raw.pttl("p:all") == -1


async def test_redis_trims_the_namespace_set_to_max_per_namespace(redis_url: str,
                                                                 raw: redis.Redis) -> None:
    store = RedisStore.from_url(redis_url, prefix="p:", ttl_s=None, max_per_namespace=2)
    try:
        for i in range(5):
            await store.put(entry(f"k{i}", created=float(i)))
    finally:
        await store.close()
    assert await raw.zrange("p:ns:ns", 0, -1) == [b"k3", b"k4"]
    assert await raw.zcard("p:all") == 5


async def test_redis_drops_ids_whose_hash_is_gone_when_met(redis_url: str,
                                                           raw: redis.Redis) -> None:
    store = RedisStore.from_url(redis_url, ttl_s=None)
    try:
        await store.put(entry("gone", created=1.0))  # the best match for A
        await store.put(entry("kept", created=2.0, vector=B))
        await raw.delete("kvgate:cache:e:gone")  # as if it expired or Redis evicted it
        assert [e.id for e in await store.entries()] == ["kept"]
        assert await store.count() == 1
        assert await raw.zrange("kvgate:cache:all", 0, -1) == [b"kept"]
        found = await store.nearest("ns", A, -1.0)
        assert found is not None and found[0] == entry("kept", created=2.0, vector=B)
        assert await raw.zrange("kvgate:cache:ns:ns", 0, -1) == [b"kept"]
        assert await raw.hkeys("kvgate:cache:nv:ns") == [b"kept"]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("vector", b"\x05\x00\x00\x00junk", id="a vector of the wrong length"),
        pytest.param("created", b"yesterday", id="created not a number"),
        pytest.param("model", b"\xff\xfe", id="model not UTF-8"),
        pytest.param("answer", None, id="a field missing"),
    ],
)
async def test_redis_skips_an_entry_that_does_not_decode(
        redis_url: str, raw: redis.Redis, caplog: pytest.LogCaptureFixture, field: str,
        value: bytes | None) -> None:
    """Decision: a corrupt entry reads as absent and is logged, never raised, so one bad hash
    cannot turn the cache off; its neighbours are still served and a put repairs it."""
    store = RedisStore.from_url(redis_url, ttl_s=None)
    try:
        await store.put(entry("bad", vector=A, created=2.0))
        await store.put(entry("good", vector=B, created=1.0))
        if value is None:
            await raw.hdel("kvgate:cache:e:bad", field)
        else:
            await raw.hset("kvgate:cache:e:bad", field, value)
        with caplog.at_level(logging.WARNING, logger="kvgate.cache"):
            assert await store.get("bad") is None
            assert [e.id for e in await store.entries()] == ["good"]
            found = await store.nearest("ns", A, 0.0)
        assert found is not None and found[0].id == "good"
        assert "kvgate:cache:e:bad" in caplog.text and "does not decode" in caplog.text
        await store.put(entry("bad", vector=A, created=3.0))
        assert await store.get("bad") == entry("bad", vector=A, created=3.0)
    finally:
        await store.close()


def test_redis_refuses_bad_limits() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        RedisStore.from_url("redis://127.0.0.1:1/0", ttl_s=-1.0)


async def test_redis_get_without_the_vector_leaves_it_unread(redis_url: str,
                                                             raw: redis.Redis) -> None:
    store = RedisStore.from_url(redis_url, prefix="p:", ttl_s=None)
    await store.put(entry("k", vector=B))
    found = await store.get("k", vector=False)
    assert found is not None and found.vector is None
    await raw.hdel("p:e:k", "answer")  # an entry missing a field is skipped, as by a whole read
    assert await store.get("k", vector=False) is None
    await store.close()
