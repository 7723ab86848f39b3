"""Per-key request rate limits: a token bucket of `rpm` tokens refilled at `rpm` a minute; a
completion request without a token gets 429 `rate_limit_exceeded` with Retry-After."""

from __future__ import annotations

import orjson
import pytest

from gateway.ratelimit import DEFAULT_OUTPUT_TOKENS, TokenBucket, estimated_tokens, tokens_used
from tests.test_gateway_auth import (
    ADMIN_KEY,
    KEYS,
    USER_KEY,
    bearer,
    call,
    eventually_stored,
    gateway,
)


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


def test_a_bucket_charges_amounts_and_settles_the_difference() -> None:
    bucket = TokenBucket(600, now=0.0)  # 10 tokens a second
    assert bucket.take(0.0, 500) == 0.0
    assert bucket.take(0.0, 200) == pytest.approx(10.0)  # 100 left: 100 more take 10 s
    bucket.settle(0.0, 300)  # the 500 charged used 200
    assert bucket.take(0.0, 200) == 0.0
    bucket.settle(0.0, -400)  # it used 600: the balance goes below zero, and waits it out
    assert bucket.take(0.0, 100) == pytest.approx(30.0)  # from -200 to 100 at 10 a second


def test_an_amount_over_the_capacity_waits_for_a_full_bucket() -> None:
    bucket = TokenBucket(60, now=0.0)
    assert bucket.take(0.0, 1000) == 0.0  # charged the whole 60
    assert bucket.take(30.0, 1000) == pytest.approx(30.0)


def test_a_requests_estimate_is_its_prompt_over_4_plus_its_max_tokens() -> None:
    assert estimated_tokens(401, 100) == 101 + 100
    assert estimated_tokens(0, None) == DEFAULT_OUTPUT_TOKENS


@pytest.mark.parametrize(("usage", "served", "used"), [
    pytest.param({"prompt_tokens": 5, "completion_tokens": 3}, True, 8,
                 id="an answer with usage used its prompt and completion tokens"),
    pytest.param({"prompt_tokens": 5}, True, 5, id="a count the usage lacks counts nothing"),
    pytest.param({"prompt_tokens": "5", "completion_tokens": 3}, True, 3,
                 id="a count that is not an integer counts nothing"),
    pytest.param(None, True, None, id="a backend served it without usage: keep the estimate"),
    pytest.param(None, False, 0, id="no backend took it: it used nothing"),
])
def test_a_request_settles_its_estimate_on_what_it_used(
        usage: dict[str, object] | None, served: bool, used: int | None) -> None:
    assert tokens_used(usage, served=served) == used


async def test_a_key_over_its_tpm_gets_429_and_a_cache_hit_is_not_charged() -> None:
    keys = [{**KEYS[0], "tpm": 60}, *KEYS[1:]]
    body = {"model": "llama-3-8b", "max_tokens": 40, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}]}
    async with gateway({"keys": keys}, cache={"enabled": True, "max_temperature": None}) as (
            url, http):
        chat = url + "/v1/chat/completions"
        async with http.post(chat, json=body, headers=bearer(USER_KEY)) as resp:
            assert resp.status == 200  # charged 1 + 40, settled on its usage (over 40)
            await resp.read()
        await eventually_stored(http, url)
        other = {**body, "messages": [{"role": "user", "content": "hello"}]}
        async with http.post(chat, json=other, headers=bearer(USER_KEY)) as resp:
            assert resp.status == 429
            assert orjson.loads(await resp.read())["error"]["code"] == "rate_limit_exceeded"
            assert int(resp.headers["Retry-After"]) >= 1
        async with http.post(chat, json=body, headers=bearer(USER_KEY)) as resp:
            assert resp.status == 200  # the same question: answered from the cache, uncharged
            assert resp.headers["x-kvgate-cache"] == "exact"
        # Another key's budget is its own.
        async with http.post(chat, json=other, headers=bearer(ADMIN_KEY)) as resp:
            assert resp.status == 200


async def test_a_request_is_settled_on_its_usage_so_a_short_answer_frees_its_estimate() -> None:
    keys = [{**KEYS[0], "tpm": 4000}, *KEYS[1:]]
    async with gateway({"keys": keys}) as (url, http):
        chat = url + "/v1/chat/completions"
        first = {"model": "llama-3-8b", "max_tokens": 3000,
                 "messages": [{"role": "user", "content": "hi"}]}  # charged 1 + 3000
        async with http.post(chat, json=first, headers=bearer(USER_KEY)) as resp:
            assert resp.status == 200
            usage = orjson.loads(await resp.read())["usage"]
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        assert used < 2400  # the simulator's answer to "hi" stops by itself well short
        # Fits only if the first was settled on its usage (4000 - used left), not on its
        # estimate (999 left).
        second = {**first, "max_tokens": 3500 - used}
        async with http.post(chat, json=second, headers=bearer(USER_KEY)) as resp:
            assert resp.status == 200
