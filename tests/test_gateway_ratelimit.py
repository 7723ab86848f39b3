"""Per-key request rate limits: a token bucket of `rpm` tokens refilled at `rpm` a minute; a
completion request without a token gets 429 `rate_limit_exceeded` with Retry-After."""

from __future__ import annotations

import pytest

from gateway.ratelimit import TokenBucket
from tests.test_gateway_auth import KEYS, USER_KEY, bearer, call, gateway


def test_a_full_bucket_lets_a_burst_of_rpm_requests_through_then_says_how_long_to_wait() -> None:
    bucket = TokenBucket(3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(20.0)  # one token every 60 / 3 s


def test_tokens_come_back_at_rpm_a_minute_up_to_rpm() -> None:
    bucket = TokenBucket(60, now=0.0)
    for _ in range(60):
        bucket.take(0.0)
    assert bucket.take(0.5) == pytest.approx(0.5)  # half a token so far
    assert bucket.take(1.0) == 0.0
    bucket = TokenBucket(2, now=0.0)
    # An hour idle still holds only 2: the third waits a full 30 s.
    assert [bucket.take(3600.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(30.0)]


def test_a_bucket_needs_a_rate() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TokenBucket(0, now=0.0)


async def test_a_key_over_its_rpm_gets_429_with_retry_after_and_other_keys_do_not() -> None:
    keys = [{**KEYS[0], "rpm": 2}, *KEYS[1:]]
    async with gateway({"keys": keys}) as (url, http):
        chat = url + "/v1/chat/completions"
        assert [(await call(http, "POST", chat, bearer(USER_KEY)))[0] for _ in range(2)] == [
            200, 200]
        status, headers, payload = await call(http, "POST", chat, bearer(USER_KEY))
        assert status == 429
        assert payload["error"]["code"] == "rate_limit_exceeded"
        assert payload["error"]["type"] == "rate_limit_error"
        assert 1 <= int(headers["Retry-After"]) <= 30
        # Not a completion: not counted.
        assert (await call(http, "GET", url + "/v1/models", bearer(USER_KEY)))[0] == 200
        # Another key has its own (here no) limit.
        assert (await call(http, "POST", chat, bearer("sk-hashed-0123456789abcdef")))[0] == 200
