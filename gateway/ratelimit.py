"""A token bucket: the per-key rate limits (`auth.keys[].rpm` and `tpm`), pure, clock passed in.

A key with `rpm: N` may send N completion requests at once and then N a minute, one every 60/N
seconds. A key with `tpm: T` may have T model tokens (prompt plus output) computed a minute: a
request is charged its estimate when it is sent to a backend (the prompt's characters / 4 plus its
`max_tokens`), and the difference from its usage is settled when it ends, so a key that asks for
long answers and gets short ones is not held to the estimate. A request beyond either limit gets
429 `rate_limit_exceeded` with Retry-After, the seconds until the bucket holds enough again. Cache
hits compute no tokens and are not charged them. Each gateway replica counts its own: behind R
replicas a key gets up to R times its limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class TokenBucket:
    __slots__ = ("_rate", "_capacity", "_tokens", "_updated")

    def __init__(self, per_minute: int, now: float) -> None:
        if per_minute < 1:
            raise ValueError(f"a rate limit needs at least 1 a minute, not {per_minute}")
        self._rate = per_minute / 60.0  # tokens a second
        self._capacity = float(per_minute)
        self._tokens = self._capacity
        self._updated = now

    def take(self, now: float, amount: float = 1.0) -> float:
        """0.0 when `amount` may go now (and is taken), else the seconds until it may. An amount
        over the capacity is charged the whole capacity: it goes when the bucket is full."""
        self._refill(now)
        amount = min(amount, self._capacity)
        if self._tokens >= amount:
            self._tokens -= amount
            return 0.0
        return (amount - self._tokens) / self._rate

    def settle(self, now: float, delta: float) -> None:
        """Gives back `delta` (or, negative, takes it: the balance may go below zero, and the
        next requests wait it out)."""
        self._refill(now)
        self._tokens = min(self._capacity, self._tokens + delta)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(self._capacity, self._tokens + elapsed * self._rate)
        self._updated = now


CHARS_PER_TOKEN = 4  # a prompt's token estimate: English text runs ~4 characters a token
DEFAULT_OUTPUT_TOKENS = 256  # charged for a request without max_tokens, settled on its usage


def estimated_tokens(prompt_chars: int, max_tokens: int | None) -> int:
    """What a request is charged against `tpm` when it is sent."""
    output = max_tokens if max_tokens is not None else DEFAULT_OUTPUT_TOKENS
    return -(-prompt_chars // CHARS_PER_TOKEN) + output


def tokens_used(usage: Mapping[str, Any] | None, *, served: bool) -> int | None:
    """What a request that ended used against `tpm`, to settle its estimate with: its usage's
    prompt plus completion tokens; 0 when no backend took it (refused by admission, the client
    gone while queued); None, keep the estimate, when one served it without saying its usage."""
    if usage is not None:
        return sum(v for name in ("prompt_tokens", "completion_tokens")
                   if isinstance(v := usage.get(name), int))
    return None if served else 0
