"""`CacheTap`: the proxy's view of the cache on a miss.

It sees the answer as it is relayed (SSE lines, or the decoded JSON body) and, once the answer
ended whole, hands it to its owner (the `ResponseCache`) to store and to settle the identical
requests waiting for it. An answer cut at its length is stored only when the client set
`max_tokens`; an answer naming other weights than its key is stored under its own key
(`rekey`). In shadow mode it carries the semantic hit that was not served, recorded once the
request's own answer is known. A stream followed by identical streams may be carried on after
its client left (`carry_on`): then the upstream's end, not the request's, ends the tap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from gateway.cache.answer import CachedAnswer, StreamCollector, answer_from_payload
from gateway.cache.keys import CacheKey
from gateway.cache.live import Live
from gateway.cache.shadow import Shadowed
from gateway.cache.vectors import Vector


class TapOwner(Protocol):
    """What a tap asks of the cache that made it."""

    def keep(self, key: CacheKey, vector: Vector | None, answer: CachedAnswer) -> None: ...
    def settle(self, key: CacheKey, answer: CachedAnswer | None) -> None: ...
    def record_shadow(self, shadowed: Shadowed, answer: CachedAnswer | None) -> None: ...


class CacheTap:
    """The proxy's view of the cache on a miss: sees the relayed answer, stores it if whole."""

    __slots__ = ("_cache", "_key", "_vector", "_collector", "_leads", "_live", "_shadow",
                 "_rekey", "_carried")

    def __init__(self, cache: TapOwner, key: CacheKey, vector: Vector | None, *,
                 leads: bool = False, live: Live | None = None, shadow: Shadowed | None = None,
                 rekey: Callable[[CachedAnswer], CacheKey] | None = None) -> None:
        self._cache = cache
        self._key = key
        self._vector = vector
        self._collector: StreamCollector | None = None
        self._leads = leads  # identical requests may be waiting for this one's answer
        self._live = live  # identical streams may be following this one
        self._shadow = shadow  # the semantic hit shadow mode did not serve
        self._rekey = rekey  # the key an answer naming other weights goes under
        self._carried = False  # the upstream goes on for followers after the client left

    def followed(self) -> bool:
        """Identical streams follow this one right now."""
        return self._live is not None and self._live.followers > 0

    def carry_on(self) -> None:
        """The client left but followers remain: the upstream is read on for them, and this
        tap is ended by `carried_end`, not by the request's `release`."""
        self._carried = True

    def carried_end(self, usage: dict[str, Any] | None, *, whole: bool) -> None:
        """The upstream read on for followers ended (`whole`: the stream finished)."""
        self._carried = False
        if whole:
            self.stream_ended(usage)
        self.release()

    def stream_lines(self, lines: bytes) -> None:
        """Complete SSE lines as relayed to the client."""
        if self._collector is None:
            self._collector = StreamCollector(self._key.kind)
        self._collector.feed(lines)
        if self._live is not None:
            self._live.feed(lines)

    def stream_ended(self, usage: dict[str, Any] | None) -> None:
        """The stream ended whole (no failure): store what it said, if it can be replayed.
        `usage` is the stream's usage object, which the client may not have been sent."""
        answer = self._collector.answer() if self._collector is not None else None
        if answer is None:
            return
        if answer.completion_tokens is None and usage is not None:
            answer = replace(answer, prompt_tokens=_token_count(usage, "prompt_tokens"),
                             completion_tokens=_token_count(usage, "completion_tokens"))
        self._kept(answer)

    def whole(self, payload: object) -> None:
        """A 200 JSON answer, decoded (None when its body was not JSON)."""
        answer = answer_from_payload(self._key.kind, payload)
        if answer is not None:
            self._kept(answer)

    def release(self) -> None:
        """The request ended, however: followers still waiting ask a backend themselves. While
        the upstream is carried on for followers, it is that which ends the tap."""
        if self._carried:
            return
        if self._shadow is not None:
            self._cache.record_shadow(self._shadow, None)
            self._shadow = None
        if self._leads:
            self._leads = False
            self._cache.settle(self._key, None)

    def _kept(self, answer: CachedAnswer) -> None:
        if self._shadow is not None:
            self._cache.record_shadow(self._shadow, answer)
            self._shadow = None
        if answer.finish_reason != "length" or self._key.capped:
            key = self._rekey(answer) if self._rekey is not None else self._key
            self._cache.keep(key, self._vector, answer)
        if self._leads:
            self._leads = False
            self._cache.settle(self._key, answer)


def _token_count(usage: Mapping[str, Any], name: str) -> int | None:
    """The count if it is one `CachedAnswer.from_bytes` accepts back (a non-negative int): an
    answer stored with any other would be read back as corrupt, a miss every time."""
    value = usage.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
