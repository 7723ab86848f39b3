"""What this gateway sent one backend: its recent prefill load (`PrefillRate`) and the record
(`BackendWork`) the TTFT model (routing/predict.py) reads the backend's queue and batch from.

Pure bookkeeping: times are passed in and must not go backwards; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque

from routing.ttft import PREFILL_RATE_TAU_S


class PrefillRate:
    """Uncached prompt tokens per second sent to one backend, exponentially averaged over
    `tau_s`. `now` must not go backwards (an earlier value counts as the latest seen)."""

    __slots__ = ("_tau", "_sum", "_at")

    def __init__(self, tau_s: float = PREFILL_RATE_TAU_S) -> None:
        if not tau_s > 0.0:
            raise ValueError("tau_s must be > 0")
        self._tau = tau_s
        self._sum = 0.0
        self._at = -math.inf

    def _decay(self, now: float) -> None:
        if now > self._at:
            if self._sum:
                self._sum *= math.exp((self._at - now) / self._tau)
            self._at = now

    def add(self, tokens: int, now: float) -> None:
        self._decay(now)
        self._sum += tokens

    @property
    def tau_s(self) -> float:
        return self._tau

    def total(self, now: float) -> float:
        """The decayed sum of tokens at `now` (`rate` is it over `tau_s`)."""
        self._decay(now)
        return self._sum

    def rate(self, now: float, extra_tokens: int = 0) -> float:
        """The rate at `now`, as if `extra_tokens` were added now too."""
        self._decay(now)
        return (self._sum + extra_tokens) / self._tau


class BackendWork:
    """The gateway's own record of the work it sent one backend: its recent prefill load, a fluid
    model of its prefill backlog, the uncached prompt sizes of its last `memory` dispatches (in
    dispatch order, so the scrape's FIFO waiting queue can be read as the last of them) and the
    context tokens of its requests in flight there. `now` must not go backwards."""

    __slots__ = ("rate", "version", "_recent", "_recent_tokens", "_memory", "_context",
                 "_inflight", "_backlog", "_backlog_at", "_scrape_at", "_scrape_waiting",
                 "_since_n", "_queue", "_queue_at")

    def __init__(self, tau_s: float = PREFILL_RATE_TAU_S, memory: int = 256) -> None:
        if memory < 1:
            raise ValueError("memory must be >= 1")
        self.rate = PrefillRate(tau_s)
        # Bumped by every dispatch and finish: what a prediction read from this record is
        # still valid for, at one instant (routing/predict.py caches per version and time).
        self.version = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_tokens = 0
        self._memory = memory
        self._context = 0.0
        self._inflight = 0
        self._backlog = 0.0
        self._backlog_at = -math.inf
        # The last scrape read (`queued_tokens`): its time and waiting count, the dispatches
        # since it, and the queue it implies: `_queue` tokens as of `_queue_at`.
        self._scrape_at = math.nan
        self._scrape_waiting = -1
        self._since_n = 0
        self._queue = 0.0
        self._queue_at = math.nan

    def backlog(self, now: float, tokens_per_s: float) -> float:
        """Uncached prompt tokens sent here and not yet prefilled, had the backend prefilled
        without pause at `tokens_per_s` since each arrived (chunked prefill shares every step
        with the decodes, which take a small part of a prefill step's time)."""
        if now > self._backlog_at:
            if self._backlog:
                self._backlog = max(0.0, self._backlog - (now - self._backlog_at) * tokens_per_s)
            self._backlog_at = now
        return self._backlog

    def dispatched(self, now: float, uncached_tokens: int, context_tokens: float,
                   tokens_per_s: float) -> None:
        self.version += 1
        self.rate.add(uncached_tokens, now)
        self._backlog = self.backlog(now, tokens_per_s) + uncached_tokens
        if len(self._recent) >= self._memory:
            self._recent_tokens -= self._recent.popleft()[1]
        self._recent.append((now, uncached_tokens))
        self._recent_tokens += uncached_tokens
        if now >= self._scrape_at:  # False while no scrape was read (NaN)
            self._since_n += 1
            self._queue = self._drained(now, tokens_per_s) + uncached_tokens
            self._queue_at = now
        self._context += context_tokens
        self._inflight += 1

    def finished(self, context_tokens: float) -> None:
        self.version += 1
        self._inflight -= 1
        self._context = max(0.0, self._context - context_tokens) if self._inflight else 0.0

    def mean_uncached(self) -> float | None:
        """Mean uncached prompt of the recent dispatches; None before the first."""
        return self._recent_tokens / len(self._recent) if self._recent else None

    def context_per_request(self) -> float | None:
        """Mean context (prompt plus half the expected reply) of the requests in flight."""
        return self._context / self._inflight if self._inflight > 0 else None

    def queued_tokens(self, taken_at: float, waiting: int, now: float, tokens_per_s: float,
                      max_walk: int = 64) -> tuple[int, float]:
        """(requests dispatched since the scrape at `taken_at`, uncached prompt tokens not yet
        prefilled): the larger of two readings. The fluid backlog (`backlog`: what this gateway
        sent, including prompts a scrape shows as running mid-prefill); and the scrape's
        `waiting` queue, taken as the last prompts sent before it (FIFO; beyond `max_walk` of
        them, at their mean; other gateways' requests count alike), plus every prompt dispatched
        since, each worked off at `tokens_per_s` from when it was sent.

        Dispatches since the scrape drain like the rest: counting them in full until the next
        scrape made every backend look busier the longer ago it was scraped, and as scrapes are
        staggered, requests herded onto whichever backend had just been read.

        The record is walked once per scrape (its figures are then grown by each dispatch), so
        a decision costs O(1) however many came since."""
        if taken_at != self._scrape_at or waiting != self._scrape_waiting:
            self._read_scrape(taken_at, waiting, tokens_per_s, max_walk)
        return self._since_n, max(self._drained(now, tokens_per_s),
                                  self.backlog(now, tokens_per_s))

    def _drained(self, now: float, tokens_per_s: float) -> float:
        """The scrape-anchored queue at `now` (never earlier than its last update)."""
        return max(0.0, self._queue - max(0.0, now - self._queue_at) * tokens_per_s)

    def _read_scrape(self, taken_at: float, waiting: int, tokens_per_s: float,
                     max_walk: int) -> None:
        since: list[tuple[float, int]] = []
        ahead, seen = 0.0, 0
        for at, tokens in reversed(self._recent):
            if at >= taken_at:
                since.append((at, tokens))
                continue
            if seen >= waiting or seen >= max_walk:
                break
            ahead += tokens
            seen += 1
        if seen < waiting:
            mean = ahead / seen if seen else (self.mean_uncached() or 0.0)
            ahead += (waiting - seen) * mean
        self._scrape_at, self._scrape_waiting = taken_at, waiting
        self._since_n, self._queue, self._queue_at = len(since), ahead, taken_at
        for at, tokens in reversed(since):
            self._queue = self._drained(at, tokens_per_s) + tokens
            self._queue_at = at
