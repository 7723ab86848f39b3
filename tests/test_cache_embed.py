"""The hashing embedder: near-duplicates close, one decisive word apart, stable everywhere."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cache.embed import INLINE_CHARS, HashingEmbedder, hashed_vector
from gateway.cache.vectors import cosine, encode_vector

ROOT = Path(__file__).resolve().parent.parent
FRANCE = "What is the capital of France?"
LONG = ("What is the fastest way in Python to remove duplicates from a list while keeping the"
        " original order?")
LONG_SWAPPED = ("What is the fastest way to remove duplicates from a list in Python while keeping"
                " the original order?")
BREAD = "How can I make my sourdough bread rise higher without it collapsing in the oven?"
BREAD_SWAPPED = "How can I make my sourdough bread rise higher in the oven without it collapsing?"

def similarity(a: str, b: str) -> float:
    return cosine(hashed_vector(a), hashed_vector(b))


# The contract's MUST-hold table: near-duplicates >= 0.9, one decisive word < 0.8, unrelated < 0.3.
MUST = [
    pytest.param(FRANCE, "what's the capital of france", ">=", 0.9,
                 id="contraction, case and punctuation are near-duplicates"),
    pytest.param(FRANCE, "What is the capital of France ?  ", ">=", 0.9,
                 id="stray spaces are near-duplicates"),
    pytest.param(LONG, LONG_SWAPPED, ">=", 0.9, id="a phrase moved in a long question"),
    pytest.param(BREAD, BREAD_SWAPPED, ">=", 0.9, id="two clauses swapped in a long question"),
    pytest.param(FRANCE, "What is the capital of Spain?", "<", 0.8,
                 id="France vs Spain: one decisive word"),
    pytest.param("How do I sort a list in Python?", "How do I sort a list in Java?", "<", 0.8,
                 id="Python vs Java: one decisive word"),
    pytest.param(FRANCE, "How do I sort a list in Python?", "<", 0.3, id="unrelated questions"),
    pytest.param("Write a haiku about autumn leaves.",
                 "Explain the difference between TCP and UDP.", "<", 0.3, id="unrelated tasks"),
    pytest.param("What is the best way to cook rice?", FRANCE, "<", 0.3,
                 id="unrelated questions sharing only stopwords"),
]

# Beyond the contract: where a lexical match would serve a wrong answer, and the choices that
# keep it from doing so (kept under a 0.9 threshold), or the variants it should still see.
SHOULD = [
    pytest.param("I don't like cats", "I do not like cats", ">=", 0.9,
                 id="n't is not"),
    pytest.param("I don\u2019t like cats", "I dont like cats", ">=", 0.9,
                 id="typographic apostrophe and none at all"),
    pytest.param("What's the capital of France?", "Tell me the capital of France.", ">=", 0.9,
                 id="a polite rewording"),
    pytest.param("What is 2+2?", "What is 2 + 2 ?", ">=", 0.9, id="spaces around operators"),
    pytest.param("What is 2+2?", "What is 2*2?", "<", 0.8, id="operators are not punctuation"),
    pytest.param("What is 12345 * 6789?", "What is 12345 * 6788?", "<", 0.8,
                 id="numbers one digit apart"),
    pytest.param("Round 3.14159 to 2 places", "Round 3.14158 to 2 places", "<", 0.9,
                 id="decimals one digit apart"),
    pytest.param("How do I sort a list in C++?", "How do I sort a list in C?", "<", 0.8,
                 id="c++ is not c"),
    pytest.param("Should I use a list or a tuple?", "Should I not use a list or a tuple?", "<",
                 0.9, id="negation is a content word"),
    pytest.param("Why does Python sort lists?", "How does Python sort lists?", "<", 0.9,
                 id="why vs how is a different question"),
    pytest.param("Convert 100 degrees Celsius to Fahrenheit",
                 "Convert 100 degrees Fahrenheit to Celsius", "<", 0.9,
                 id="swapped arguments in a short request"),
]


@pytest.mark.parametrize(("a", "b", "relation", "bound"), MUST + SHOULD)
def test_similarity(a: str, b: str, relation: str, bound: float) -> None:
    value = similarity(a, b)
    assert (value >= bound) if relation == ">=" else (value < bound), value
    assert value == pytest.approx(similarity(b, a))


@pytest.mark.parametrize("text", ["", "   \n\t", "?!. ,;", "'''"],
                         ids=["empty", "whitespace", "punctuation", "apostrophes"])
def test_text_without_words_is_the_empty_vector(text: str) -> None:
    assert hashed_vector(text) == {}


def test_identical_text_has_cosine_one() -> None:
    assert similarity(LONG, LONG) == pytest.approx(1.0)


@pytest.mark.parametrize("dimensions", [1, 64, 1 << 20])
def test_vectors_are_unit_length_inside_their_dimensions(dimensions: int) -> None:
    vector = hashed_vector(LONG, dimensions=dimensions)
    assert math.fsum(value * value for value in vector.values()) == pytest.approx(1.0)
    assert all(0 <= index < dimensions for index in vector)


def test_dimensions_must_be_positive() -> None:
    with pytest.raises(ValueError, match="dimensions"):
        hashed_vector(FRANCE, dimensions=0)


def test_vectors_are_the_same_in_every_process() -> None:
    script = ("import sys; from gateway.cache.embed import hashed_vector;"
              " from gateway.cache.vectors import encode_vector;"
              " print(encode_vector(dict(sorted(hashed_vector(sys.argv[1]).items()))).hex())")
    text = f"{LONG} {FRANCE} c++ 2+2 don't"
    expected = encode_vector(dict(sorted(hashed_vector(text).items()))).hex()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script, text], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True, timeout=60)
        assert done.stdout.strip() == expected


@pytest.mark.parametrize("text", [FRANCE, " ".join([LONG] * (INLINE_CHARS // len(LONG) + 1))],
                         ids=["short text inline", "long text in a thread"])
async def test_the_embedder_gives_hashed_vector(text: str) -> None:
    embedder = HashingEmbedder()
    assert embedder.name == "hashing-v1"
    assert await embedder.embed(text) == hashed_vector(text)
