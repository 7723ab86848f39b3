"""Fault row: fuzzed requests. Hypothesis generates bodies and headers around what the gateway
validates (gateway/schemas.py), and schemathesis generates requests for every operation of the
OpenAPI description the gateway publishes at `/openapi.json`; about 10,000 in all, against one
`kvgate serve` in front of a backend that always answers. Every answer must be one a client can
parse (a completion, or OpenAI's error body), never a server error, and the gateway must serve
on afterwards with its descriptors back to their baseline."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway.schemas import ROLES
from tests.faults import procs
from tests.faults.clients import MODEL, Answer, is_openai_error, send
from tests.faults.loop import LoopThread
from tests.faults.rows import FD_DEADLINE_S, FD_SLACK
from tests.waiting import until

# Generating a request costs more than sending it, so an example draws BODIES bodies and
# HEADER_SETS header sets and sends every pairing: 50 requests at once per example.
BODIES, HEADER_SETS = 10, 5
BATCH = BODIES * HEADER_SETS
EXAMPLES = 160  # 8,000 requests of fuzzed bodies and headers
ENCODING_EXAMPLES = 20  # 1,000 bodies under a fuzzed Content-Encoding
SCHEMATHESIS_EXAMPLES = 20  # 1,000 requests drawn from every operation of /openapi.json


class Fleet:
    def __init__(self) -> None:
        self.loop = LoopThread()
        self.stack = AsyncExitStack()
        backend = self.loop.run(self.stack.enter_async_context(procs.misbehaving("ok", "good")))
        self.gateway = self.loop.run(self.stack.enter_async_context(
            procs.gateway(procs.gateway_config([backend], server={"max_messages": 64}))))
        self.http = self.loop.run(self._session())
        self.fds = self.gateway.fds()

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=BATCH))

    def send_all(self, requests: list[tuple[str, bytes, dict[str, str]]]) -> list[Answer]:
        async def everything() -> list[Answer]:
            return list(await asyncio.gather(*(
                send(self.http, self.gateway.url, body, path=path, headers=headers,
                     deadline_s=30) for path, body, headers in requests)))
        return self.loop.run(everything())

    def close(self) -> None:
        self.loop.run(self.http.close())
        self.loop.run(self.stack.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    started = Fleet()
    try:
        yield started
    finally:
        started.close()


def check(answers: list[Answer]) -> None:
    for answer in answers:
        assert answer.kind != "lost", answer
        assert answer.status is not None and answer.status < 500, answer


# JSON values of every kind, for the fields the gateway checks and for the ones it passes on.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                    st.floats(allow_nan=False),
                    st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(ROLES), json_values)},
    optional={"content": st.one_of(st.text(max_size=40), json_values,
                                   st.lists(st.fixed_dictionaries(
                                       {"type": st.just("text"), "text": st.text(max_size=20)}),
                                       max_size=3)),
              "name": json_values}), max_size=70)
chat_bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), st.text(max_size=10), json_values)},
    optional={"messages": st.one_of(messages, json_values),
              "stream": st.one_of(st.booleans(), json_values),
              "stream_options": st.one_of(st.fixed_dictionaries(
                  {"include_usage": st.one_of(st.booleans(), json_values)}), json_values),
              "max_tokens": st.one_of(st.integers(-5, 64), json_values),
              "max_completion_tokens": st.one_of(st.integers(-5, 64), json_values),
              "n": st.one_of(st.integers(-1, 3), json_values),
              "temperature": st.one_of(st.floats(-1, 3), json_values),
              "top_p": st.one_of(st.floats(-1, 2), json_values),
              "seed": json_values, "user": json_values, "tools": json_values})
prompt_bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), json_values)},
    optional={"prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(0, 5000)),
                                  json_values),
              "stream": st.one_of(st.booleans(), json_values),
              "max_tokens": st.one_of(st.integers(-5, 64), json_values)})
raw_bodies = st.one_of(st.binary(max_size=200), json_values.map(orjson.dumps))
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=40)
headers = st.fixed_dictionaries({}, optional={
    "x-request-id": header_text, "authorization": header_text, "cache-control": header_text,
    "x-kvgate-model-route": header_text, "x-kvgate-priority": header_text,
    "traceparent": header_text, "accept": header_text})


def _encoded(value: Any) -> bytes:
    return orjson.dumps(value)


bodies = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), chat_bodies.map(_encoded)),
    st.tuples(st.just("/v1/completions"), prompt_bodies.map(_encoded)),
    st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), raw_bodies),
)
# No shrinking: a batch of 50 takes long to shrink, and the failing answer names itself.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


@FUZZ
@given(drawn=st.lists(bodies, min_size=BODIES, max_size=BODIES),
       header_sets=st.lists(headers, min_size=HEADER_SETS, max_size=HEADER_SETS))
def test_fuzzed_bodies_and_headers_get_an_answer_or_an_openai_error(
        fleet: Fleet, drawn: list[tuple[str, bytes]], header_sets: list[dict[str, str]]) -> None:
    check(fleet.send_all([(path, body, h) for path, body in drawn for h in header_sets]))


encodings = st.tuples(st.sampled_from(["gzip", "deflate", "br", "identity", "x-junk"]),
                      st.binary(max_size=120))


@settings(FUZZ, max_examples=ENCODING_EXAMPLES)
@given(batch=st.lists(encodings, min_size=BATCH, max_size=BATCH))
def test_fuzzed_content_encodings_are_a_400_never_a_500(
        fleet: Fleet, batch: list[tuple[str, bytes]]) -> None:
    check(fleet.send_all([("/v1/chat/completions", body,
                           {"content-encoding": encoding}) for encoding, body in batch]))


@pytest.fixture(scope="module")
def operations(fleet: Fleet) -> st.SearchStrategy[Any]:
    """A strategy of schemathesis cases over every operation `/openapi.json` describes."""
    api = schemathesis.openapi.from_url(fleet.gateway.url + "/openapi.json")
    return st.one_of([result.ok().as_strategy() for result in api.get_all_operations()])


@settings(FUZZ, max_examples=SCHEMATHESIS_EXAMPLES)
@given(data=st.data())
def test_schemathesis_requests_from_openapi_json_are_never_a_server_error(
        fleet: Fleet, operations: st.SearchStrategy[Any], data: st.DataObject) -> None:
    cases = data.draw(st.lists(operations, min_size=BATCH, max_size=BATCH))
    answers = fleet.loop.run(_call_all(fleet, cases))
    for (method, path), (status, body) in zip(
            ((c.method, c.formatted_path) for c in cases), answers, strict=True):
        assert status < 500, (method, path, body[:300])
        if status >= 400:
            assert is_openai_error(orjson.loads(body)), (method, path, status, body[:300])


async def _call_all(fleet: Fleet, cases: list[Any]) -> list[tuple[int, bytes]]:
    async def call(case: Any) -> tuple[int, bytes]:
        sent = case.as_transport_kwargs(base_url=fleet.gateway.url)
        # json, not orjson: the generated values include integers past 64 bits.
        data = json.dumps(sent["json"]).encode() if "json" in sent else sent.get("data")
        headers = {k: v for k, v in sent["headers"].items()
                   if k.lower() not in ("accept-encoding", "connection")}
        if "json" in sent:
            headers["Content-Type"] = "application/json"
        async with asyncio.timeout(30), fleet.http.request(
                sent["method"], sent["url"], params=sent.get("params"), data=data,
                headers=headers) as resp:
            return resp.status, await resp.read()
    return list(await asyncio.gather(*(call(c) for c in cases)))


def test_after_the_fuzzing_the_gateway_serves_with_its_descriptors_back(fleet: Fleet) -> None:
    ok = fleet.send_all([("/v1/chat/completions", _encoded(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}), {})] * 10)
    assert all(a.kind == "ok" for a in ok), ok
    fleet.loop.run(until(lambda: fleet.gateway.fds() <= fleet.fds + FD_SLACK + BATCH,
                         "the gateway's descriptors back to their baseline", FD_DEADLINE_S),
                   timeout_s=FD_DEADLINE_S + 5)
