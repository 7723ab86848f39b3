"""`ResponseCache` and `CacheTap`: which later requests a kept answer serves (exact, semantic or
not at all), how a failing, hanging or corrupt store degrades to a miss, and what a tap stores.

The real `MemoryStore` and `HashingEmbedder` serve every behaviour they can; small fakes stand in
only for failure modes (a store whose calls raise or never answer, one that returns corrupt
entries) and for an embedder of another name. The cooldown runs on an injected clock. Answers are
stored in the background: tests wait for them by polling the store with a deadline, or await
`close()`, which awaits the stores still running, before asserting that nothing was stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
import pytest
import redis.exceptions

from gateway.cache.answer import CachedAnswer
from gateway.cache.cache import (
    COOLDOWN_S,
    ERROR_LOG_INTERVAL_S,
    EXACT,
    SEMANTIC,
    Embedder,
    ResponseCache,
)
from gateway.cache.embed import HashingEmbedder, hashed_vector
from gateway.cache.keys import CacheKey
from gateway.cache.store import Admits, CacheStore, Entry, MemoryStore
from gateway.cache.vectors import Vector, cosine

T = TypeVar("T")

MODEL = "llama-3-8b"
SYSTEM = "You are terse."
QUESTION = "What is the capital of France?"
NEAR = "Tell me the capital of France."  # cosine 0.96 with QUESTION: a near-duplicate
FAR = "What is the capital of Spain?"  # cosine 0.57: another question
THRESHOLD = 0.9
WALL = 1_700_000_000.0  # the injected wall clock: entries' `created`
DEADLINE_S = 10.0  # for polls, and a guard against a cache that hangs with its store
PARIS = CachedAnswer(kind="chat", model=MODEL, text="Paris.", finish_reason="stop",
                     prompt_tokens=21, completion_tokens=3)


@dataclass
class FakeClock:
    """The monotonic clock the cooldown counts on."""
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


class NamedEmbedder:
    """The hashing embedder's very vectors under another name: another vector space."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def embed(self, text: str) -> Vector:
        return hashed_vector(text)


def memory_store() -> MemoryStore:
    return MemoryStore(max_entries=100, ttl_s=None, clock=lambda: WALL)


class FaultyStore(MemoryStore):
    """A real MemoryStore whose calls the cache makes (get, nearest, put, bump) fail while `fault`
    is set: raising it, or with "hang" awaiting an event no one sets. `calls` names every one of
    those calls that reached the store."""

    def __init__(self, fault: Exception | Literal["hang"] | None = None) -> None:
        super().__init__(max_entries=100, ttl_s=None, clock=lambda: WALL)
        self.fault = fault
        self.calls: list[str] = []
        self._never = asyncio.Event()

    async def _reach(self, call: str) -> None:
        self.calls.append(call)
        if isinstance(self.fault, Exception):
            raise self.fault
        if self.fault == "hang":
            await self._never.wait()

    async def get(self, id: str, *, vector: bool = True) -> Entry | None:
        await self._reach("get")
        return await super().get(id, vector=vector)

    async def nearest(self, namespace: str, vector: Vector, threshold: float,
                      admits: Admits | None = None) -> tuple[Entry, float] | None:
        await self._reach("nearest")
        return await super().nearest(namespace, vector, threshold, admits)

    async def put(self, entry: Entry) -> None:
        await self._reach("put")
        await super().put(entry)

    async def bump(self, counter: str, by: int = 1) -> None:
        await self._reach("bump")
        await super().bump(counter, by)


class CorruptStore(MemoryStore):
    """Answers the exact tier, or the semantic one, with an entry whose answer bytes are `raw`;
    counts the lookups that reached it."""

    def __init__(self, raw: bytes, tier: str) -> None:
        super().__init__(max_entries=100, ttl_s=None, clock=lambda: WALL)
        self._entry = Entry(id="corrupt", namespace="any", vector={1: 1.0}, answer=raw,
                            model=MODEL, query=QUESTION, created=WALL)
        self._tier = tier
        self.lookups = 0

    async def get(self, id: str, *, vector: bool = True) -> Entry | None:
        self.lookups += 1
        return self._entry if self._tier == EXACT else None

    async def nearest(self, namespace: str, vector: Vector, threshold: float,
                      admits: Admits | None = None) -> tuple[Entry, float] | None:
        return (self._entry, 0.99) if self._tier == SEMANTIC else None


def request(question: str, *, system: str = SYSTEM, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}], **extra}


def key_of(cache: ResponseCache, question: str, *, system: str = SYSTEM, **extra: Any
           ) -> CacheKey:
    key = cache.key("chat", request(question, system=system, **extra), MODEL)
    assert isinstance(key, CacheKey)
    return key


async def eventually(probe: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """`probe()` once `done` holds of it, or its last value after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        value = await probe()
        if done(value) or loop.time() > deadline:
            return value
        await asyncio.sleep(0.002)


async def stored(store: CacheStore, entries: int = 1) -> int:
    """How many entries `store` holds once it holds `entries` (stores run in the background)."""
    return await eventually(store.count, lambda count: count >= entries)


async def kept(cache: ResponseCache, question: str = QUESTION, answer: CachedAnswer = PARIS,
               **key_args: Any) -> CacheKey:
    """Stores `answer` for `question` the way a miss does, and waits until it is stored."""
    key = key_of(cache, question, **key_args)
    before = await cache.store.count()
    cache.keep(key, await cache.embedding(key), answer)
    assert await stored(cache.store, before + 1) == before + 1
    return key


MakeCache = Callable[..., ResponseCache]
HASHING = HashingEmbedder()


@pytest.fixture
async def make_cache() -> AsyncIterator[MakeCache]:
    """Builds caches (a fresh MemoryStore, the hashing embedder, a fake clock unless given) and
    closes each at the end, so no background store outlives its test."""
    made: list[ResponseCache] = []

    def make(store: CacheStore | None = None, embedder: Embedder | None = HASHING, *,
             clock: Callable[[], float] | None = None, timeout_s: float = 0.25) -> ResponseCache:
        cache = ResponseCache(store if store is not None else memory_store(), embedder,
                              threshold=THRESHOLD, timeout_s=timeout_s, wall_clock=lambda: WALL,
                              clock=clock if clock is not None else FakeClock())
        made.append(cache)
        return cache

    yield make
    for cache in made:
        await cache.close()


# Which later requests an answer kept for QUESTION (under SYSTEM) serves.

SERVED = [
    pytest.param(QUESTION, {}, EXACT, id="the same request is an exact hit"),
    pytest.param("what's the capital of france", {}, SEMANTIC,
                 id="the question reworded is a semantic hit"),
    pytest.param(NEAR, {}, SEMANTIC, id="a near-duplicate question is a semantic hit"),
    pytest.param(FAR, {}, None, id="a question below the threshold is a miss"),
    pytest.param("How do I sort a list in Python?", {}, None, id="an unrelated question misses"),
    pytest.param(QUESTION, {"system": "You are verbose."}, None,
                 id="the same question after another system prompt is a miss"),
    pytest.param(NEAR, {"system": "You are verbose."}, None,
                 id="a near-duplicate after another system prompt is a miss"),
    pytest.param(QUESTION, {"max_tokens": 64}, None,
                 id="the same question with other parameters is a miss"),
    pytest.param(QUESTION, {"stream": True, "user": "bob"}, EXACT,
                 id="fields that cannot change the answer do not matter"),
]


@pytest.mark.parametrize(("question", "key_args", "tier"), SERVED)
async def test_which_requests_a_kept_answer_serves(
        make_cache: MakeCache, question: str, key_args: dict[str, Any], tier: str | None) -> None:
    cache = make_cache()
    await kept(cache)
    found = await cache.lookup(key_of(cache, question, **key_args))
    if tier is None:
        assert found.hit is None
        return
    assert found.hit is not None
    assert (found.hit.tier, found.hit.answer) == (tier, PARIS)


async def test_a_semantic_hit_reports_the_similarity_and_keeps_the_question_vector(
        make_cache: MakeCache) -> None:
    cache = make_cache()
    await kept(cache)
    found = await cache.lookup(key_of(cache, NEAR))
    assert found.hit is not None and found.hit.tier == SEMANTIC
    expected = cosine(hashed_vector(QUESTION), hashed_vector(NEAR))
    assert THRESHOLD <= found.hit.similarity < 1.0
    assert found.hit.similarity == pytest.approx(expected)
    assert found.vector == hashed_vector(NEAR)


async def test_an_exact_hit_has_similarity_one(make_cache: MakeCache) -> None:
    cache = make_cache()
    await kept(cache)
    found = await cache.lookup(key_of(cache, QUESTION))
    assert found.hit is not None
    assert (found.hit.tier, found.hit.similarity) == (EXACT, 1.0)


async def test_a_miss_hands_back_the_question_vector_so_its_answer_can_be_found_later(
        make_cache: MakeCache) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    found = await cache.lookup(key)
    assert found.hit is None and found.vector == hashed_vector(QUESTION)
    cache.keep(key, found.vector, PARIS)
    await stored(cache.store)
    hit = (await cache.lookup(key_of(cache, NEAR))).hit
    assert hit is not None and hit.tier == SEMANTIC


@pytest.mark.parametrize(("question", "tier"), [
    pytest.param(QUESTION, EXACT, id="the same request is still an exact hit"),
    pytest.param(NEAR, None, id="a near-duplicate is a miss"),
    pytest.param("what's the capital of france", None, id="even a reworded one is a miss"),
])
async def test_without_an_embedder_only_exact_hits(
        make_cache: MakeCache, question: str, tier: str | None) -> None:
    cache = make_cache(embedder=None)
    await kept(cache)
    found = await cache.lookup(key_of(cache, question))
    assert found.vector is None
    assert (found.hit.tier if found.hit is not None else None) == tier


@pytest.mark.parametrize(("reader", "tier"), [
    pytest.param(HASHING.name, SEMANTIC, id="an embedder of the same name shares vectors"),
    pytest.param("other-v1", None, id="vectors of another embedder name never match"),
])
async def test_semantic_matches_stay_within_one_embedder_name(
        make_cache: MakeCache, reader: str, tier: str | None) -> None:
    # Both embedders give the very same vectors: only the name keeps them apart.
    writer = make_cache(embedder=HASHING)
    await kept(writer)
    other = make_cache(writer.store, NamedEmbedder(reader))
    found = await other.lookup(key_of(other, NEAR))
    assert (found.hit.tier if found.hit is not None else None) == tier


async def test_the_exact_tier_does_not_depend_on_the_embedder(make_cache: MakeCache) -> None:
    writer = make_cache(embedder=HASHING)
    await kept(writer)
    for embedder in (NamedEmbedder("other-v1"), None):
        reader = make_cache(writer.store, embedder)
        hit = (await reader.lookup(key_of(reader, QUESTION))).hit
        assert hit is not None and hit.tier == EXACT


async def test_keep_records_the_entry_for_the_store(make_cache: MakeCache) -> None:
    cache = make_cache()
    key = await kept(cache)
    assert await cache.store.entries() == [
        Entry(id=key.id, namespace=f"{HASHING.name}/{key.namespace}",
              vector=hashed_vector(QUESTION), answer=PARIS.to_bytes(), model=MODEL,
              query=QUESTION, created=WALL)]


async def test_lookups_and_stores_are_counted_in_the_store(make_cache: MakeCache) -> None:
    cache = make_cache()
    await kept(cache)
    await cache.lookup(key_of(cache, QUESTION))
    await cache.lookup(key_of(cache, NEAR))
    await cache.lookup(key_of(cache, FAR))
    await cache.lookup(key_of(cache, FAR, system="You are verbose."))
    expected = {"exact": 1, "semantic": 1, "miss": 2, "store": 1}
    assert await eventually(cache.store.counters, lambda got: got == expected) == expected


async def test_an_exact_hit_is_one_store_call_its_count_added_later() -> None:
    store = FaultyStore(None)
    cache = ResponseCache(store, HASHING, threshold=THRESHOLD, wall_clock=lambda: WALL,
                          count_flush_s=DEADLINE_S * 10)
    key = await kept(cache)
    await cache.flush_counts()
    store.calls.clear()
    assert (await cache.lookup(key)).hit is not None
    assert (await cache.lookup(key)).hit is not None
    assert store.calls == ["get", "get"]  # no counter round trip on the request's path
    assert (await store.counters())["exact"] == 0
    await cache.flush_counts()
    assert store.calls == ["get", "get", "bump"]  # both hits in one call
    assert (await store.counters())["exact"] == 2
    await cache.close()


async def test_counts_reach_the_store_within_the_flush_interval_and_at_close() -> None:
    store = memory_store()
    cache = ResponseCache(store, None, threshold=THRESHOLD, wall_clock=lambda: WALL,
                          count_flush_s=0.01)
    await cache.lookup(key_of(cache, QUESTION))
    assert await eventually(store.counters, lambda got: got["miss"] == 1) == {
        "exact": 0, "semantic": 0, "miss": 1, "store": 0}
    slow = ResponseCache(store, None, threshold=THRESHOLD, wall_clock=lambda: WALL,
                         count_flush_s=DEADLINE_S * 10)
    await slow.lookup(key_of(slow, QUESTION))
    assert (await store.counters())["miss"] == 1
    await slow.close()
    assert (await store.counters())["miss"] == 2
    await cache.close()


# A store that fails: every failure is a miss (or a store not made), never an error.

STORE_ERRORS = [
    pytest.param(redis.exceptions.ConnectionError("Error 111 connecting to localhost:6379."),
                 id="redis connection refused"),
    pytest.param(redis.exceptions.TimeoutError("Timeout reading from socket"),
                 id="redis timeout"),
    pytest.param(OSError(104, "Connection reset by peer"), id="socket reset"),
]


@pytest.mark.parametrize("error", STORE_ERRORS)
async def test_a_raising_store_is_a_miss_and_turns_the_cache_off_for_the_cooldown(
        make_cache: MakeCache, error: Exception) -> None:
    clock = FakeClock()
    cache = make_cache(FaultyStore(error), clock=clock)
    assert cache.available
    failed_at = clock.now
    found = await cache.lookup(key_of(cache, QUESTION))
    assert found.hit is None
    assert not cache.available
    clock.now = failed_at + COOLDOWN_S * 0.999
    assert not cache.available
    clock.now = failed_at + COOLDOWN_S
    assert cache.available


async def test_during_the_cooldown_lookups_skip_the_store_and_after_it_they_hit_again(
        make_cache: MakeCache) -> None:
    clock = FakeClock()
    store = FaultyStore()
    cache = make_cache(store, clock=clock)
    await kept(cache)
    store.fault = redis.exceptions.ConnectionError("Connection refused")
    failed_at = clock.now
    assert (await cache.lookup(key_of(cache, QUESTION))).hit is None
    store.fault = None  # the store is back, but the cache does not know yet
    calls = len(store.calls)
    clock.now = failed_at + COOLDOWN_S / 2
    assert (await cache.lookup(key_of(cache, QUESTION))).hit is None
    assert len(store.calls) == calls
    clock.now = failed_at + COOLDOWN_S
    hit = (await cache.lookup(key_of(cache, QUESTION))).hit
    assert hit is not None and hit.tier == EXACT


async def test_keep_during_the_cooldown_stores_nothing(make_cache: MakeCache) -> None:
    store = FaultyStore(OSError(111, "Connection refused"))
    cache = make_cache(store)
    key = key_of(cache, QUESTION)
    found = await cache.lookup(key)
    assert not cache.available
    store.fault = None
    cache.keep(key, found.vector, PARIS)
    await cache.close()  # awaits the background store
    assert "put" not in store.calls
    assert await store.count() == 0


async def test_keep_after_the_cooldown_stores_again(make_cache: MakeCache) -> None:
    clock = FakeClock()
    store = FaultyStore(OSError(111, "Connection refused"))
    cache = make_cache(store, clock=clock)
    assert (await cache.lookup(key_of(cache, QUESTION))).hit is None
    store.fault = None
    clock.now += COOLDOWN_S
    assert cache.available
    await kept(cache)


async def test_a_failing_store_put_starts_the_cooldown(make_cache: MakeCache) -> None:
    store = FaultyStore(redis.exceptions.ConnectionError("Connection refused"))
    cache = make_cache(store)
    cache.keep(key_of(cache, QUESTION), None, PARIS)
    await cache.close()
    assert store.calls == ["put"]  # and not the "store" counter after it
    assert not cache.available


@pytest.mark.parametrize("call", ["lookup", "keep"])
async def test_a_hanging_store_costs_one_timeout_then_a_cooldown(
        make_cache: MakeCache, call: str) -> None:
    store = FaultyStore("hang")
    cache = make_cache(store, timeout_s=0.05)
    key = key_of(cache, QUESTION)
    async with asyncio.timeout(DEADLINE_S):  # a guard: the test fails rather than hang
        if call == "lookup":
            found = await cache.lookup(key)
            assert found.hit is None
            assert found.vector == hashed_vector(QUESTION)
        else:
            cache.keep(key, hashed_vector(QUESTION), PARIS)
            await cache.close()
    assert store.calls == ["get" if call == "lookup" else "put"]
    assert not cache.available


async def test_store_failures_are_logged_at_most_once_per_interval(
        make_cache: MakeCache, caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    cache = make_cache(FaultyStore(OSError(111, "Connection refused")), clock=clock)
    caplog.set_level(logging.WARNING, logger="kvgate.cache")

    async def fail_at(now: float) -> None:
        clock.now = now
        assert cache.available
        await cache.lookup(key_of(cache, QUESTION))
        assert not cache.available

    start = clock.now
    await fail_at(start)
    await fail_at(start + COOLDOWN_S)
    assert len(caplog.records) == 1
    assert "Connection refused" in caplog.records[0].getMessage()
    await fail_at(start + ERROR_LOG_INTERVAL_S)
    assert len(caplog.records) == 2


CORRUPT = [
    pytest.param(b"\x00\xffnot json", id="not JSON"),
    pytest.param(b'["Paris."]', id="not an object"),
    pytest.param(orjson.dumps({"kind": "chat", "model": MODEL, "text": "Paris.",
                               "finish_reason": "tool_calls"}), id="an unservable finish_reason"),
]


@pytest.mark.parametrize("tier", [EXACT, SEMANTIC])
@pytest.mark.parametrize("raw", CORRUPT)
async def test_a_corrupt_entry_is_a_miss_without_a_cooldown(
        make_cache: MakeCache, raw: bytes, tier: str) -> None:
    store = CorruptStore(raw, tier)
    cache = make_cache(store)
    assert (await cache.lookup(key_of(cache, QUESTION))).hit is None
    assert cache.available
    assert (await cache.lookup(key_of(cache, QUESTION))).hit is None
    assert store.lookups == 2  # the second lookup still asked the store
    expected = {"exact": 0, "semantic": 0, "miss": 2, "store": 0}
    assert await eventually(store.counters, lambda got: got == expected) == expected


# CacheTap: what a miss's relayed answer leaves in the cache.

def body(message: dict[str, Any], *, finish_reason: str = "stop",
         usage: dict[str, int] | None = None, choices: int = 1) -> dict[str, Any]:
    """A backend's 200 JSON answer, decoded (as the proxy hands it to the tap)."""
    data: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
        "choices": [{"index": index, "message": {"role": "assistant", **message},
                     "logprobs": None, "finish_reason": finish_reason}
                    for index in range(choices)]}
    if usage is not None:
        data["usage"] = usage
    return data


USAGE = {"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24}
TOOL_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "capital", "arguments": '{"country": "France"}'}}


@pytest.mark.parametrize(("raw", "answer"), [
    pytest.param(body({"content": "Paris."}, usage=USAGE), PARIS,
                 id="a stopped answer is stored with its usage"),
    pytest.param(body({"content": "Paris is"}, finish_reason="length"),
                 CachedAnswer("chat", MODEL, "Paris is", "length", None, None),
                 id="an answer cut at length is stored, counts unknown without usage"),
])
async def test_whole_stores_a_200_answer(
        make_cache: MakeCache, raw: dict[str, Any], answer: CachedAnswer) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    cache.tap(key, hashed_vector(QUESTION)).whole(raw)
    await stored(cache.store)
    hit = (await cache.lookup(key)).hit
    assert hit is not None and hit.answer == answer


@pytest.mark.parametrize("raw", [
    pytest.param(body({"content": None, "tool_calls": [TOOL_CALL]}, finish_reason="tool_calls"),
                 id="a tool call"),
    pytest.param(body({"content": "Paris.", "tool_calls": [TOOL_CALL]}),
                 id="text with a tool call"),
    pytest.param(body({"content": None, "refusal": "I cannot."}), id="a refusal"),
    pytest.param(body({"content": "Paris."}, choices=2), id="two choices"),
    pytest.param(body({"content": "Paris."}, finish_reason="content_filter"),
                 id="a filtered answer"),
    pytest.param({"error": {"message": "boom", "type": "server_error"}}, id="an error body"),
    pytest.param(None, id="not JSON"),
])
async def test_whole_stores_nothing_it_could_not_replay(make_cache: MakeCache,
                                                        raw: object) -> None:
    cache = make_cache()
    cache.tap(key_of(cache, QUESTION), hashed_vector(QUESTION)).whole(raw)
    await cache.close()
    assert await cache.store.count() == 0


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (event.encode() if isinstance(event, str) else orjson.dumps(event))
                    + b"\n\n" for event in events)


def chunk(content: str | None = None, *, finish_reason: str | None = None,
          usage: dict[str, int] | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}], "usage": usage}


def usage_chunk(usage: dict[str, int]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [], "usage": usage}


ANSWER_EVENTS = (chunk(""), chunk("Par"), chunk("is."), chunk(finish_reason="stop"))


@pytest.mark.parametrize(("lines", "usage", "counts"), [
    pytest.param(sse(*ANSWER_EVENTS, usage_chunk(USAGE), "[DONE]"), None, (21, 3),
                 id="counts from the stream's own usage chunk"),
    pytest.param(sse(*ANSWER_EVENTS, "[DONE]"), USAGE, (21, 3),
                 id="counts from the usage passed to stream_ended when the stream had none"),
    pytest.param(sse(*ANSWER_EVENTS, usage_chunk(USAGE), "[DONE]"),
                 {"prompt_tokens": 99, "completion_tokens": 99}, (21, 3),
                 id="the stream's own counts win over the usage passed"),
    pytest.param(sse(*ANSWER_EVENTS, "[DONE]"), None, (None, None),
                 id="counts unknown without any usage"),
    pytest.param(sse(*ANSWER_EVENTS, "[DONE]"), {"prompt_tokens": -1, "completion_tokens": True},
                 (None, None), id="a usage that holds no token counts leaves them unknown"),
])
async def test_a_stream_that_ended_whole_is_stored(
        make_cache: MakeCache, lines: bytes, usage: dict[str, Any] | None,
        counts: tuple[int | None, int | None]) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    tap = cache.tap(key, hashed_vector(QUESTION))
    middle = len(lines) // 2  # fed in the pieces the proxy relays: whole lines
    middle = lines.index(b"\n\n", middle) + 2
    tap.stream_lines(lines[:middle])
    tap.stream_lines(lines[middle:])
    tap.stream_ended(usage)
    await stored(cache.store)
    hit = (await cache.lookup(key)).hit
    assert hit is not None
    # Kept with the pieces the backend streamed ("Par", "is."), which a replay sends again.
    assert hit.answer == CachedAnswer("chat", MODEL, "Paris.", "stop", *counts, cuts=(3, 3))


@pytest.mark.parametrize("lines", [
    pytest.param(sse(chunk(""), chunk("Par"), chunk("is."), "[DONE]"), id="no finish_reason"),
    pytest.param(sse(chunk("Par"), chunk("is.", finish_reason="tool_calls")),
                 id="finished for a tool call"),
    pytest.param(sse(chunk("Par"), {"error": {"message": "boom"}}), id="an error event"),
    pytest.param(b"", id="no lines at all"),
])
async def test_a_stream_that_cannot_be_replayed_stores_nothing(
        make_cache: MakeCache, lines: bytes) -> None:
    cache = make_cache()
    tap = cache.tap(key_of(cache, QUESTION), hashed_vector(QUESTION))
    if lines:
        tap.stream_lines(lines)
    tap.stream_ended(USAGE)
    await cache.close()
    assert await cache.store.count() == 0


# Identical requests in flight: the first miss leads, the ones that may wait follow it.


async def test_a_follower_gets_the_leaders_answer_as_an_exact_hit(make_cache: MakeCache) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    leader = cache.tap(key, None)
    follower = asyncio.create_task(cache.lookup(key, follow_s=10.0))
    await asyncio.sleep(0)  # the follower is waiting
    assert not follower.done()
    leader.whole(body({"content": "Paris."}, usage=USAGE))
    hit = (await follower).hit
    assert hit is not None and (hit.tier, hit.answer) == (EXACT, PARIS)


@pytest.mark.parametrize("ending", ["released", "uncacheable"])
async def test_a_follower_misses_when_the_leader_ends_without_an_answer(
        make_cache: MakeCache, ending: str) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    leader = cache.tap(key, None)
    follower = asyncio.create_task(cache.lookup(key, follow_s=10.0))
    await asyncio.sleep(0)
    if ending == "uncacheable":
        leader.whole(body({"content": None, "tool_calls": [TOOL_CALL]},
                          finish_reason="tool_calls"))
    leader.release()  # the handler always releases its tap
    assert (await follower).hit is None
    # The next miss leads again: a request arriving while it runs follows it.
    again = cache.tap(key, None)
    second = asyncio.create_task(cache.lookup(key, follow_s=10.0))
    await asyncio.sleep(0)
    again.whole(body({"content": "Paris."}, usage=USAGE))
    hit = (await second).hit
    assert hit is not None and hit.answer == PARIS


async def test_a_follower_stops_waiting_after_follow_s(make_cache: MakeCache) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    leader = cache.tap(key, None)
    assert (await cache.lookup(key, follow_s=0.01)).hit is None
    leader.release()


async def test_without_follow_s_a_miss_does_not_wait(make_cache: MakeCache) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION)
    leader = cache.tap(key, None)
    assert (await cache.lookup(key)).hit is None  # a stream: it asks a backend itself
    second = cache.tap(key, None)  # and does not lead while the first does
    leader.release()
    second.release()


@pytest.mark.parametrize(("age", "max_age_s", "hit"), [
    pytest.param(10.0, None, True, id="no max-age: any age"),
    pytest.param(10.0, 60.0, True, id="younger than max-age: a hit"),
    pytest.param(120.0, 60.0, False, id="older than max-age: a miss"),
    pytest.param(1.0, 0.0, False, id="max-age 0: always a miss"),
])
async def test_max_age_refuses_older_answers_in_both_tiers(
        age: float, max_age_s: float | None, hit: bool) -> None:
    now = [WALL]
    cache = ResponseCache(memory_store(), HASHING, threshold=THRESHOLD,
                          wall_clock=lambda: now[0], clock=FakeClock())
    await kept(cache)
    now[0] = WALL + age
    for question in (QUESTION, NEAR):  # the exact tier, then the semantic one
        found = await cache.lookup(key_of(cache, question), max_age_s=max_age_s)
        assert (found.hit is not None) is hit
    await cache.close()
