"""The simulator's token rule, made-up output and natural output lengths."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.sim.tokens import (
    count_tokens,
    natural_output_length,
    output_piece,
    output_pieces,
    output_seed,
    tokenize,
)

PROSE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the "
    "age of foolishness, it was the epoch of belief, it was the epoch of incredulity. Continuous "
    "batching lets an inference server add new requests to a running batch at every iteration "
    "instead of waiting for the whole batch to finish, which keeps the GPU busy and the queue "
    "short. A paged cache stores keys and values in fixed-size blocks, so memory is allocated on "
    "demand and shared between requests that start with the same system prompt."
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", 0, id="empty text has no tokens"),
        pytest.param("the", 1, id="a short word is one token"),
        pytest.param(" the", 1, id="a word takes one leading space"),
        pytest.param(" cache", 1, id="six characters with the space are still one token"),
        pytest.param(" information", 2, id="a long piece is cut into six-character chunks"),
        pytest.param("a" * 13, 3, id="thirteen letters make three chunks"),
        pytest.param("Hello, world!", 4, id="punctuation runs are their own tokens"),
        pytest.param("a  b", 3, id="extra spaces form their own piece"),
        pytest.param("line\n\nnext", 4, id="each newline before a word is a piece"),
    ],
)
def test_token_count_follows_the_documented_rule(text: str, expected: int) -> None:
    assert count_tokens(text) == expected
    assert len(tokenize(text)) == expected


def test_the_same_piece_always_gets_the_same_id() -> None:
    first, second = tokenize(" the the")
    assert first == second
    assert tokenize("cache") != tokenize("block")


def test_english_prose_averages_about_four_characters_per_token() -> None:
    assert 3.5 <= len(PROSE) / count_tokens(PROSE) <= 4.5


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_count_tokens_equals_the_length_of_tokenize(text: str) -> None:
    assert count_tokens(text) == len(tokenize(text))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=300))
def test_each_output_piece_and_their_concatenation_count_one_token_apiece(
    key: bytes, n: int
) -> None:
    pieces = output_pieces(key, n)
    assert len(pieces) == n
    assert all(count_tokens(piece) == 1 for piece in pieces)
    assert count_tokens("".join(pieces)) == n


def test_output_pieces_are_a_pure_function_of_key_and_position() -> None:
    key = b"what is a kv cache?"
    assert output_pieces(key, 50) == output_pieces(key, 50)
    assert output_pieces(key, 50)[:20] == output_pieces(key, 20)
    seed = output_seed(key)
    assert [output_piece(seed, i) for i in range(50)] == output_pieces(key, 50)
    assert output_pieces(b"another prompt", 50) != output_pieces(key, 50)


def test_natural_length_is_a_pure_function_of_key_and_seed() -> None:
    assert natural_output_length(b"prompt", 7) == natural_output_length(b"prompt", 7)
    by_seed = {natural_output_length(b"prompt", seed) for seed in range(20)}
    assert len(by_seed) > 10


def test_natural_lengths_have_a_median_near_200_and_a_tail_into_the_thousands() -> None:
    lengths = sorted(natural_output_length(f"request {i}".encode(), 0) for i in range(4000))
    assert min(lengths) >= 1
    assert 170 <= statistics.median(lengths) <= 230
    assert lengths[int(0.99 * len(lengths))] > 1000
