"""`ResponseCache`: the gateway's two cache tiers over one store, failing open.

A lookup walks the tiers in order: `exact` (the canonical request's hash, gateway/cache/keys.py),
then `semantic` (the nearest earlier question, by the embedder's cosine similarity, among the
entries that share everything but the question: same model, parameters, system prompt and earlier
turns). A miss hands the proxy a `CacheTap`, which sees the answer as it is relayed and stores it
once it ended whole.

The semantic tier looks only at a request sampled at temperature 0 or with a seed whose question
the embedder reads whole (within its window), and every candidate above the threshold must pass
the near-miss guard (gateway/cache/semantic.py's `Vetting`). In `shadow` mode a candidate that
passed is not served: the request goes to a backend as a miss, and once its own answer is known,
the pair is recorded with whether the two answers agreed (gateway/cache/shadow.py).

The key names the weights (`revision`): the configured `model_revision` of the model's backends
and the `system_fingerprint` its answers carry, learned per model as answers come. An answer
whose fingerprint differs from the one its key was made with is stored under its own. An answer
cut at its length (`finish_reason: length`) is stored only when the client set `max_tokens`:
without one, the cut is the backend's limit, not the client's wish.

The cache must never be why a request fails or waits: every store call runs under `timeout_s`,
and an error or a timeout counts as a miss (or a store not made), is logged at most once per
`ERROR_LOG_INTERVAL_S`, and turns the cache off for `COOLDOWN_S` so a Redis that went away costs
one timeout, not one per request. Stores run as tasks after the answer went out; `close` awaits
the ones still running.

The store's shared counters (`kvgate cache stats`) are counted in the process and added to the
store at most once every `COUNT_FLUSH_S` (one call per counter that moved), not once per
request: an exact hit then costs one store round trip. `flush_counts` adds them at once (the
admin endpoint calls it before reading them; `close` does too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gateway.cache.answer import CachedAnswer
from gateway.cache.keys import Bypass, CacheKey, Kind, cache_key
from gateway.cache.live import Live
from gateway.cache.semantic import Vetting
from gateway.cache.shadow import Shadowed, shadow_record
from gateway.cache.store import CacheStore, Entry
from gateway.cache.tap import CacheTap as CacheTap  # re-exported: the tap a lookup hands out
from gateway.cache.vectors import Vector, cosine

log = logging.getLogger("kvgate.cache")

COOLDOWN_S = 5.0  # after a store error or timeout, the cache is skipped this long
ERROR_LOG_INTERVAL_S = 60.0
COUNT_FLUSH_S = 1.0  # lookups and stores are added to the store's counters this often
EXACT = "exact"
SEMANTIC = "semantic"

T = TypeVar("T")


class Embedder(Protocol):
    """One question to its vector (None: the embedder cannot answer now). An embedder with a
    window also has `async fits(text) -> bool` (gateway/cache/semantic.py's `Questions`)."""

    @property
    def name(self) -> str: ...

    async def embed(self, text: str) -> Vector | None: ...


@dataclass(frozen=True, slots=True)
class Hit:
    tier: str  # EXACT or SEMANTIC: the x-kvgate-cache value
    answer: CachedAnswer
    similarity: float  # 1.0 for an exact hit
    created: float  # wall-clock seconds when the answer was stored (the response's Age)


@dataclass(frozen=True, slots=True)
class Lookup:
    """What a lookup found; `vector` (the question's embedding) is kept to store the answer;
    `shadow`, in shadow mode, the semantic hit it would have served."""

    hit: Hit | None
    vector: Vector | None
    shadow: Shadowed | None = None


class ResponseCache:
    def __init__(
        self,
        store: CacheStore,
        embedder: Embedder | None,
        *,
        threshold: float,
        max_temperature: float | None = None,
        shadow: bool = False,
        timeout_s: float = 0.25,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        count_flush_s: float = COUNT_FLUSH_S,
    ) -> None:
        self.store = store
        self._embedder = embedder  # None: the exact tier only
        self._threshold = threshold
        self._max_temperature = max_temperature
        self._shadow = shadow  # semantic candidates recorded, never served
        self.vetting = Vetting()
        self._fingerprints: dict[str, str] = {}  # model -> the system_fingerprint last seen
        self._timeout_s = timeout_s
        self._wall_clock = wall_clock
        self._clock = clock
        self._down_until = float("-inf")
        self._last_error_log = float("-inf")
        self._pending: set[asyncio.Task[None]] = set()
        self._counts: dict[str, int] = {}  # counted here, not yet added to the store's
        self._count_flush_s = count_flush_s
        self._flusher: asyncio.Task[None] | None = None
        # Requests in flight to a backend on a miss, by key id: identical requests that want a
        # whole answer wait for the first one's instead of asking a GPU again.
        self._leaders: dict[str, asyncio.Future[CachedAnswer | None]] = {}
        # The same for streams: identical streams follow a leading stream's text as it comes.
        self._live: dict[str, Live] = {}

    def key(self, kind: Kind, body: Mapping[str, Any], model: str,
            scope: str | None = None, revision: str | None = None) -> CacheKey | Bypass:
        """`revision`: the configured revision of the model's weights, if any; the fingerprint
        learned from its answers is added here."""
        return cache_key(kind, body, model, max_temperature=self._max_temperature, scope=scope,
                         revision=_revision(revision, self._fingerprints.get(model)))

    def rekeyed(self, key: CacheKey, body: Mapping[str, Any], scope: str | None,
                revision: str | None, answer: CachedAnswer) -> CacheKey:
        """The key `answer` is stored under: `key`, unless the answer names other weights than
        those `key` was made with (then they are learned for the model)."""
        fingerprint = answer.fingerprint
        if fingerprint is None or _revision(revision, fingerprint) == key.revision:
            return key
        self._fingerprints[key.model] = fingerprint
        found = self.key(key.kind, body, key.model, scope, revision)
        return found if isinstance(found, CacheKey) else key

    @property
    def threshold(self) -> float:
        """The cosine a semantic candidate needs (before the guard)."""
        return self._threshold

    @property
    def available(self) -> bool:
        """False while cooling down after a store failure: requests go by as `bypass`."""
        return self._clock() >= self._down_until

    async def lookup(self, key: CacheKey, *, follow_s: float | None = None,
                     max_age_s: float | None = None) -> Lookup:
        """The answer stored for `key` or for the nearest question; a failing store is a miss.
        With `follow_s`, a miss whose identical request is in flight to a backend waits up to
        that long for its answer (an exact hit when it comes whole and replayable). With
        `max_age_s` (the client's `Cache-Control: max-age`), an older answer is a miss."""
        entry = await self._guarded(self.store.get(key.id, vector=False), None)
        if entry is not None and self._too_old(entry, max_age_s):
            entry = None
        if entry is not None:
            answer = self._decode(entry)
            if answer is not None:
                self._count(EXACT)
                return Lookup(Hit(EXACT, answer, 1.0, entry.created), None)
        vector = await self.embedding(key)
        shadow = None
        if vector and key.query:
            admits = self.vetting.admits_for(key.query)
            found = await self._guarded(
                self.store.nearest(self._space(key), vector, self._threshold, admits), None)
            if found is not None and not self._too_old(found[0], max_age_s):
                near, similarity = found
                answer = self._decode(near)
                if answer is not None and self._shadow:
                    shadow = Shadowed(near.id, similarity, near.query, key.query, answer.text)
                elif answer is not None:
                    self._count(SEMANTIC)
                    return Lookup(Hit(SEMANTIC, answer, similarity, near.created), vector)
        leader = self._leaders.get(key.id) if follow_s is not None else None
        if leader is not None:
            try:
                async with asyncio.timeout(follow_s):
                    answer = await asyncio.shield(leader)
            except TimeoutError:
                answer = None
            if answer is not None:
                self._count(EXACT)
                return Lookup(Hit(EXACT, answer, 1.0, self._wall_clock()), vector)
        self._count("miss")
        return Lookup(None, vector, shadow)

    @property
    def embedder(self) -> Embedder | None:
        """The semantic tier's question embedder (None: the exact tier only)."""
        return self._embedder

    async def embedding(self, key: CacheKey) -> Vector | None:
        """The question's vector for the semantic tier; None when there is no question, no
        embedder, a request sampled hotter than 0 without a seed, or a question longer than the
        embedder's window (the embedder failing is None too)."""
        if self._embedder is None or not key.query or not key.deterministic:
            return None
        try:
            fits = getattr(self._embedder, "fits", None)
            if fits is not None and not await fits(key.query):
                return None
            return await self._embedder.embed(key.query)
        except Exception as exc:  # an embedder fault must never fail the request either
            self._failed(f"the embedder failed: {type(exc).__name__}: {exc}", cooldown=False)
            return None

    def record_shadow(self, shadowed: Shadowed, answer: CachedAnswer | None) -> None:
        """The shadow hit's record, once the request's own answer is known (None: it never came
        whole), with whether the two answers agreed, in the background."""
        self._background(self._record_shadow(shadowed, answer))

    async def _record_shadow(self, shadowed: Shadowed, answer: CachedAnswer | None) -> None:
        similarity: float | None = None
        if (answer is not None and answer.text != shadowed.cached_answer
                and self._embedder is not None):
            try:
                mine = await self._embedder.embed(answer.text)
                theirs = await self._embedder.embed(shadowed.cached_answer)
            except Exception as exc:  # a shadow record must never fail anything
                log.warning("shadow: the answers could not be embedded: %s", exc)
                mine = theirs = None
            if mine is not None and theirs is not None:
                similarity = cosine(mine, theirs)
        record = shadow_record(shadowed, answer.text if answer is not None else None,
                               similarity, at=self._wall_clock())
        await self._guarded(self.store.record_shadow(record), None)

    def tap(self, key: CacheKey, vector: Vector | None, *, stream: bool = False,
            shadow: Shadowed | None = None,
            rekey: Callable[[CachedAnswer], CacheKey] | None = None) -> CacheTap:
        """The store side of a miss. The first tap of a key leads: identical requests arriving
        while it runs may wait for its answer (`lookup(follow_s=...)`), and identical streams
        follow a leading stream (`live_of`), until it is `release`d."""
        leads = key.id not in self._leaders
        live = None
        if leads:
            self._leaders[key.id] = asyncio.get_running_loop().create_future()
            if stream:
                live = self._live[key.id] = Live(key.kind)
        return CacheTap(self, key, vector, leads=leads, live=live, shadow=shadow, rekey=rekey)

    def live_of(self, key: CacheKey) -> Live | None:
        """The stream of `key` being relayed right now, if one is and can still be followed."""
        live = self._live.get(key.id)
        return None if live is None or live.spoiled or live.ended else live

    def settle(self, key: CacheKey, answer: CachedAnswer | None) -> None:
        """The leading request of `key` ended: its followers get `answer` (None: ask a backend)."""
        leader = self._leaders.pop(key.id, None)
        if leader is not None and not leader.done():
            leader.set_result(answer)
        live = self._live.pop(key.id, None)
        if live is not None:
            live.end(answer)

    def keep(self, key: CacheKey, vector: Vector | None, answer: CachedAnswer) -> None:
        """Store `answer` in the background (the client already has it)."""
        entry = Entry(id=key.id, namespace=self._space(key), vector=vector or None,
                      answer=answer.to_bytes(), model=answer.model, query=key.query or "",
                      created=self._wall_clock())
        self._background(self._put(entry))

    def _too_old(self, entry: Entry, max_age_s: float | None) -> bool:
        return max_age_s is not None and self._wall_clock() - entry.created > max_age_s

    def _space(self, key: CacheKey) -> str:
        """The store's namespace: the key's, within the embedder's own vector space (vectors of
        two embedders, or two versions of one, are not comparable)."""
        name = self._embedder.name if self._embedder is not None else "exact"
        return f"{name}/{key.namespace}"

    async def close(self) -> None:
        """Waits for the stores still running and adds the counts not yet added, then closes
        the store and the embedder."""
        others = [task for task in self._pending if task is not self._flusher]
        if others:
            await asyncio.gather(*others, return_exceptions=True)
        if self._flusher is not None:
            self._flusher.cancel()
        await self.flush_counts()
        await self.store.close()
        close = getattr(self._embedder, "close", None)
        if close is not None:
            closed = close()
            if asyncio.iscoroutine(closed):
                await closed

    async def _put(self, entry: Entry) -> None:
        if await self._guarded(self._stored(entry), False):
            self._count("store")

    async def _stored(self, entry: Entry) -> bool:
        await self.store.put(entry)
        return True

    def _count(self, counter: str) -> None:
        """One more for the store's shared counter `counter`, added within COUNT_FLUSH_S."""
        self._counts[counter] = self._counts.get(counter, 0) + 1
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())
            self._pending.add(self._flusher)
            self._flusher.add_done_callback(self._pending.discard)

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self._count_flush_s)
        finally:
            self._flusher = None
        await self.flush_counts()

    async def flush_counts(self) -> None:
        """Adds the counts made in this process since the last flush to the store's counters
        (a failing store loses them: counters are statistics, never worth a retry)."""
        counts, self._counts = self._counts, {}
        for counter, by in counts.items():
            await self._guarded(self.store.bump(counter, by), None)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _decode(self, entry: Entry) -> CachedAnswer | None:
        try:
            return CachedAnswer.from_bytes(entry.answer)
        except ValueError as exc:
            self._failed(f"entry {entry.id[:12]} is not a cached answer ({exc})", cooldown=False)
            return None

    async def _guarded(self, call: Awaitable[T], default: T) -> T:
        if not self.available:
            _close(call)
            return default
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except TimeoutError:
            self._failed(f"the cache store did not answer within {self._timeout_s:g} s")
        except Exception as exc:  # a cache fault must never fail the request
            self._failed(f"the cache store failed: {type(exc).__name__}: {exc}")
        return default

    def _failed(self, message: str, *, cooldown: bool = True) -> None:
        now = self._clock()
        if cooldown:
            self._down_until = now + COOLDOWN_S
        if now - self._last_error_log >= ERROR_LOG_INTERVAL_S:
            self._last_error_log = now
            suffix = f"; skipping the cache for {COOLDOWN_S:g} s" if cooldown else ""
            log.warning("%s%s", message, suffix)


def _revision(configured: str | None, fingerprint: str | None) -> str | None:
    """What the key names the weights by: the configured revision and the learned fingerprint."""
    if configured is None and fingerprint is None:
        return None
    return f"{configured or ''}/{fingerprint or ''}"


def _close(call: Awaitable[Any]) -> None:
    """A coroutine that will not be awaited is closed, so Python does not warn of it."""
    close = getattr(call, "close", None)
    if close is not None:
        close()
