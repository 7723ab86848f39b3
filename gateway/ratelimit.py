"""A token bucket: the per-key request rate limit (`auth.keys[].rpm`), pure, clock passed in.

A key with `rpm: N` may send N completion requests at once and then N a minute, one every 60/N
seconds; a request beyond that gets 429 `rate_limit_exceeded` with Retry-After, the seconds until
the bucket holds a token again. Each gateway replica counts its own requests: behind R replicas a
key gets up to R x N a minute.
"""

from __future__ import annotations


class TokenBucket:
    __slots__ = ("_rate", "_capacity", "_tokens", "_updated")

    def __init__(self, per_minute: int, now: float) -> None:
        if per_minute < 1:
            raise ValueError(f"a rate limit needs at least 1 request a minute, not {per_minute}")
        self._rate = per_minute / 60.0  # tokens a second
        self._capacity = float(per_minute)
        self._tokens = self._capacity
        self._updated = now

    def take(self, now: float) -> float:
        """0.0 when a request may go now (its token taken), else the seconds until one may."""
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)
        self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate
