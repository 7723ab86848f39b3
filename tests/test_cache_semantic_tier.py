"""The semantic tier's rules in `ResponseCache`, and the pieces it is made of.

- Which later request an answer kept for QUESTION serves, by how it was sampled, whether the
  guard finds a decisive difference, and whether the question fits the embedder's window.
- An answer cut at its length is stored only when the client set `max_tokens`.
- The weights are in the key: an answer naming a new `system_fingerprint` is stored under it,
  and answers of the old weights no longer serve.
- Shadow mode serves no semantic hit and records it with whether the answers agreed.
- `DenseVectors` answers as `SemanticIndex` does; `shadow.report` counts per band; the
  configuration reads the old boolean `semantic`, and the threshold defaults per embedder.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.cache.answer import CachedAnswer
from gateway.cache.cache import EXACT, SEMANTIC, ResponseCache
from gateway.cache.embed import hashed_vector
from gateway.cache.embedders.choice import THRESHOLDS, Kind
from gateway.cache.index import SemanticIndex
from gateway.cache.keys import CacheKey
from gateway.cache.setup import build_cache, threshold_of
from gateway.cache.shadow import AGREEMENT, agreed, report
from gateway.cache.store import MemoryStore
from gateway.cache.vector_index import DenseVectors
from gateway.cache.vectors import Vector
from gateway.config import CacheSettings

MODEL = "llama-3-8b"
QUESTION = "What is the capital of France?"
NEAR = "what's the capital of france"
WALL = 1_700_000_000.0
PARIS = CachedAnswer(kind="chat", model=MODEL, text="Paris.", finish_reason="stop",
                     prompt_tokens=21, completion_tokens=3)


class Windowed:
    """The hashing embedder's vectors, with a window of `window` characters."""

    name = "windowed-v1"

    def __init__(self, window: int) -> None:
        self.window = window

    async def embed(self, text: str) -> Vector:
        return hashed_vector(text)

    async def fits(self, text: str) -> bool:
        return len(text) <= self.window


def request(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": question}], **extra}


def key_of(cache: ResponseCache, question: str, **extra: Any) -> CacheKey:
    key = cache.key("chat", request(question, **extra), MODEL)
    assert isinstance(key, CacheKey)
    return key


MakeCache = Callable[..., ResponseCache]


@pytest.fixture
async def make_cache() -> AsyncIterator[MakeCache]:
    made: list[ResponseCache] = []

    def make(embedder: Any = None, *, threshold: float = 0.5, max_temperature: float = 1.0,
             shadow: bool = False) -> ResponseCache:
        store = MemoryStore(max_entries=100, ttl_s=None, clock=lambda: WALL)
        cache = ResponseCache(store, embedder if embedder is not None else Windowed(10_000),
                              threshold=threshold, max_temperature=max_temperature,
                              shadow=shadow, wall_clock=lambda: WALL)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        await cache.close()


async def drained(cache: ResponseCache) -> None:
    """The cache's background work (stores, records) done."""
    while cache._pending:
        await asyncio.gather(*cache._pending)
        await asyncio.sleep(0)  # their done callbacks run


async def kept(cache: ResponseCache, question: str = QUESTION, answer: CachedAnswer = PARIS,
               **extra: Any) -> CacheKey:
    key = key_of(cache, question, **extra)
    cache.keep(key, await cache.embedding(key), answer)
    await drained(cache)
    return key


SERVED = [
    pytest.param(NEAR, {}, SEMANTIC, id="a near question at temperature 0 is a semantic hit"),
    pytest.param(NEAR, {"temperature": 0.5}, None,
                 id="a near question sampled at 0.5 is no semantic hit"),
    pytest.param(QUESTION, {"temperature": 0.5}, None,
                 id="the same question sampled otherwise is another request"),
    pytest.param(NEAR, {"temperature": 0.7, "seed": 3}, SEMANTIC,
                 id="a near question with a seed is a semantic hit (the kept one seeded too)"),
    pytest.param("What is the capital of Spain?", {}, None,
                 id="another name, close in wording: the guard vetoes it"),
    pytest.param("What is not the capital of France?", {}, None,
                 id="a negation: the guard vetoes it"),
    pytest.param(NEAR + " " + "please " * 40, {}, None,
                 id="a question past the embedder's window is not compared"),
]


@pytest.mark.parametrize(("question", "extra", "tier"), SERVED)
async def test_which_near_requests_the_semantic_tier_serves(
        make_cache: MakeCache, question: str, extra: dict[str, Any], tier: str | None) -> None:
    cache = make_cache(Windowed(200))
    await kept(cache, **({"temperature": 0.7, "seed": 3} if "seed" in extra else {}))
    found = await cache.lookup(key_of(cache, question, **extra))
    assert (found.hit.tier if found.hit is not None else None) == tier


async def test_a_vetoed_candidate_is_passed_over_for_the_next_best(make_cache: MakeCache
                                                                  ) -> None:
    cache = make_cache()
    await kept(cache, "What is the capital of Spain?",
               CachedAnswer("chat", MODEL, "Madrid.", "stop", None, None))
    await kept(cache)
    found = await cache.lookup(key_of(cache, "what is the capital of spain"))
    assert found.hit is not None and found.hit.answer.text == "Madrid."
    assert cache.vetting.vetoes >= 1  # France's answer was the closer candidate, vetoed


LENGTH = [
    pytest.param("stop", {}, True, id="an answer that stopped is stored"),
    pytest.param("length", {}, True, id="cut at the client's max_tokens: stored"),
    pytest.param("length", {"max_tokens": None}, False,
                 id="cut without max_tokens (the backend's limit): not stored"),
    pytest.param("length", {"max_tokens": None, "max_completion_tokens": 8}, True,
                 id="cut at max_completion_tokens: stored"),
]


@pytest.mark.parametrize(("finish_reason", "extra", "stored"), LENGTH)
async def test_an_answer_cut_at_its_length_is_stored_only_under_max_tokens(
        make_cache: MakeCache, finish_reason: str, extra: dict[str, Any], stored: bool) -> None:
    cache = make_cache()
    key = key_of(cache, QUESTION, **extra)
    tap = cache.tap(key, None)
    tap.whole({"model": MODEL, "choices": [{"index": 0, "finish_reason": finish_reason,
                                            "message": {"role": "assistant", "content": "Pa"}}]})
    tap.release()
    await drained(cache)
    assert (await cache.store.count() == 1) == stored


async def test_new_weights_never_serve_the_old_ones_answers(make_cache: MakeCache) -> None:
    cache = make_cache()
    body = request(QUESTION)
    old = key_of(cache, QUESTION)
    first = CachedAnswer("chat", MODEL, "Paris.", "stop", None, None, fingerprint="fp-1")
    cache.keep(cache.rekeyed(old, body, None, None, first), None, first)
    await drained(cache)
    learned = key_of(cache, QUESTION)  # the fingerprint is learned for the model
    assert learned.id != old.id
    hit = (await cache.lookup(learned)).hit
    assert hit is not None and hit.tier == EXACT
    second = CachedAnswer("chat", MODEL, "Paris!", "stop", None, None, fingerprint="fp-2")
    assert cache.rekeyed(learned, body, None, None, second).id != learned.id
    assert (await cache.lookup(key_of(cache, QUESTION))).hit is None


def test_a_configured_model_revision_is_part_of_the_key(make_cache: MakeCache) -> None:
    cache = make_cache()
    keys = {revision: cache.key("chat", request(QUESTION), MODEL, revision=revision)
            for revision in (None, "r1", "r2")}
    ids = {key.id for key in keys.values() if isinstance(key, CacheKey)}
    assert len(ids) == 3


@pytest.mark.parametrize(("answer", "expected"), [
    pytest.param("Paris.", True, id="the same text agrees"),
    pytest.param("Madrid is the capital of Spain.", False, id="another answer does not"),
])
async def test_shadow_mode_serves_nothing_and_records_whether_the_answers_agreed(
        make_cache: MakeCache, answer: str, expected: bool) -> None:
    cache = make_cache(shadow=True)
    await kept(cache)
    key = key_of(cache, NEAR)
    found = await cache.lookup(key)
    assert found.hit is None and found.shadow is not None
    tap = cache.tap(key, found.vector, shadow=found.shadow)
    tap.whole({"model": MODEL, "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": answer}}]})
    tap.release()
    await drained(cache)
    (raw,) = await cache.store.shadow_records()
    record = orjson.loads(raw)
    assert record["agreed"] is expected
    assert (record["answer"], record["cached_answer"]) == (answer, "Paris.")
    assert record["similarity"] == pytest.approx(found.shadow.similarity)
    assert len(record["question_sha256"]) == len(record["cached_question_sha256"]) == 64


@pytest.mark.parametrize(("answer", "cosine", "expected"), [
    pytest.param("a", None, True, id="identical texts agree"),
    pytest.param("b", AGREEMENT, True, id="embeddings at the agreement cosine agree"),
    pytest.param("b", AGREEMENT - 0.01, False, id="embeddings under it do not"),
    pytest.param(None, None, None, id="no second answer: unknown"),
    pytest.param("b", None, None, id="other texts the embedder could not embed: unknown"),
])
def test_two_answers_agree_when_identical_or_close_in_meaning(
        answer: str | None, cosine: float | None, expected: bool | None) -> None:
    assert agreed("a", answer, cosine) is expected


def test_the_report_counts_precision_per_band() -> None:
    records = [{"similarity": 0.91, "agreed": True}, {"similarity": 0.93, "agreed": False},
               {"similarity": 0.99, "agreed": True}, {"similarity": 0.99, "agreed": None}]
    bands = {band.low: band for band in report(records, bands=(0.9, 0.98))}
    assert (bands[0.9].would_hit, bands[0.9].known, bands[0.9].precision) == (2, 2, 0.5)
    assert (bands[0.98].would_hit, bands[0.98].known, bands[0.98].precision) == (2, 1, 1.0)


def dense(*values: float) -> Vector:
    norm = sum(v * v for v in values) ** 0.5
    return {i: v / norm for i, v in enumerate(values)}


def test_dense_vectors_answer_as_the_sparse_index_does() -> None:
    members = {"a": dense(1, 0, 0), "b": dense(1, 1, 0), "c": dense(0, 1, 1), "z": {}}
    query = dense(1, 0.9, 0)
    sparse, learned = SemanticIndex(), DenseVectors(0, max_members=8)
    for rank, (id, vector) in enumerate(members.items()):
        sparse.add(id, vector, rank)
        learned.add(id, vector, rank)
    for threshold in (0.1, 0.7, 0.99):
        for skip in (None, {"b"}.__contains__):
            found, expected = learned.best(query, threshold, skip), sparse.best(query, threshold,
                                                                                skip)
            assert (found and found[0]) == (expected and expected[0])
    assert sorted(learned) == sorted(members) and len(learned) == 4


@pytest.mark.parametrize(("given", "mode"), [
    pytest.param(True, "on", id="the old true is on"),
    pytest.param(False, "off", id="the old false is off"),
    pytest.param("shadow", "shadow", id="shadow"),
    pytest.param("true", "on", id="true from the environment is on"),
])
def test_cache_semantic_reads_its_modes_and_the_old_boolean(given: object, mode: str) -> None:
    assert CacheSettings.model_validate({"semantic": given}).semantic == mode


@pytest.mark.parametrize("given", ["yes", 1, None])
def test_cache_semantic_refuses_anything_else_by_name(given: object) -> None:
    with pytest.raises(ValidationError, match="off, shadow or on"):
        CacheSettings.model_validate({"semantic": given})


def test_the_remote_embedder_needs_its_url() -> None:
    with pytest.raises(ValidationError, match="embedder 'openai' needs embedder_url"):
        CacheSettings.model_validate({"embedder": "openai"})
    assert CacheSettings.model_validate(
        {"embedder": "openai", "embedder_url": "http://127.0.0.1:9/v1"}).embedder == "openai"


@pytest.mark.parametrize("name", ["local", "minilm"])
def test_the_local_model_is_minilm_and_answers_to_local_too(name: str) -> None:
    assert CacheSettings.model_validate({"embedder": name}).embedder == "minilm"


def test_the_defaults_are_semantic_off_and_temperature_zero() -> None:
    settings = CacheSettings()
    assert (settings.semantic, settings.max_temperature, settings.embedder) == ("off", 0, "auto")


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param({"similarity_threshold": 0.8}, 0.8, id="a configured threshold is kept"),
    pytest.param({}, THRESHOLDS[Kind.HASHING], id="else the embedder's own default"),
])
def test_the_threshold_defaults_per_embedder(given: dict[str, Any], expected: float) -> None:
    settings = CacheSettings.model_validate({"semantic": "on", "embedder": "hashing", **given})
    assert threshold_of(settings) == expected


@pytest.mark.parametrize(("question", "tier"), [
    pytest.param("How can I reset my password?", SEMANTIC,
                 id="local model: a paraphrase is a semantic hit from the dense index"),
    pytest.param("How do I not reset my password?", None,
                 id="local model: a negation is vetoed by the guard"),
])
async def test_the_local_model_is_auto_and_its_dense_vectors_are_searched(
        question: str, tier: str | None) -> None:
    settings = CacheSettings.model_validate({"enabled": True, "semantic": "on"})
    cache = build_cache(settings)  # auto: the local model, installed with the dev extra
    try:
        assert threshold_of(settings) == THRESHOLDS[Kind.LOCAL]
        kept_key = key_of(cache, "How do I reset my password?")
        cache.keep(kept_key, await cache.embedding(kept_key), PARIS)
        await drained(cache)
        found = await cache.lookup(key_of(cache, question))
        assert (found.hit.tier if found.hit is not None else None) == tier
        assert found.vector is not None and len(found.vector) == 384
    finally:
        await cache.close()


class Broken:
    name = "broken-v1"

    async def embed(self, text: str) -> Vector:
        raise RuntimeError("the model file went away")


async def test_an_embedder_that_raises_costs_the_semantic_tier_not_the_request(
        make_cache: MakeCache) -> None:
    cache = make_cache(Broken())
    found = await cache.lookup(key_of(cache, QUESTION))
    assert (found.hit, found.vector) == (None, None)


def test_the_guard_reads_at_most_three_candidates_a_lookup_and_a_stored_question_once() -> None:
    from gateway.cache.semantic import MAX_VETTED, Vetting
    from gateway.cache.store import Entry

    def entry(number: int, question: str) -> Entry:
        return Entry(id=f"e{number}", namespace="n", vector=None, answer=b"", model="m",
                     query=question, created=0.0)

    vetting = Vetting()
    family = [entry(n, f"What is {n} squared?") for n in range(5)]
    admits = vetting.admits_for("What is 17 squared?")
    assert [admits(member) for member in family] == [False] * 5
    assert vetting.vetoes == MAX_VETTED == 3  # the last two were not read
    again = vetting.admits_for("what is 2 squared")
    assert again(family[2]) and vetting.features(family[2]) is vetting.features(family[2])
