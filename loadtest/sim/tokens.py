"""The simulator's tokenizer and its made-up model output, as pure functions.

Token counting rule (deterministic, no vocabulary file, ~4 characters per token for English):

1. Split the text into pieces with the regular expression `PIECE_PATTERN`, in the style of GPT-2's
   pre-tokenizer: a word (run of `\\w`) or a run of punctuation, each with at most one leading
   space, or a run of whitespace (a run followed by a word keeps its last space for that word).
2. A piece longer than `MAX_PIECE_CHARS` (6) characters is cut, from its start, into chunks of 6.
3. Each piece or chunk is one token; its id is `zlib.crc32` of its UTF-8 bytes, masked to 31 bits.

So " the" and " cache" are one token each, " information" is two (" infor", "mation"), and
"Hello, world!" is four ("Hello", ",", " world", "!"). Typical English prose comes out at about
4 characters per token, close to real BPE tokenizers.

Model output is made of words of at most five letters with one leading space (one token each) and
an occasional full stop, so every piece counts as exactly one token alone and in any concatenation.
Output lengths follow a seeded log-normal distribution keyed by the request content.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from statistics import NormalDist

MAX_PIECE_CHARS = 6
PIECE_PATTERN = re.compile(r" ?\w+| ?[^\w\s]+|\s+(?!\S)|\s+")

# Natural output length: log-normal with this median and log-space standard deviation. Median 200
# tokens; p90 ~ 720, p99 ~ 2,050, with a tail into the thousands, as chat answers have.
NATURAL_MEDIAN_TOKENS = 200.0
NATURAL_SIGMA = 1.0

# Output vocabulary: lower-case words of at most five letters. With their leading space each is at
# most MAX_PIECE_CHARS long, hence one token.
_WORDS: tuple[str, ...] = (
    "the", "a", "of", "to", "and", "in", "is", "it", "for", "on", "that", "with", "as", "by",
    "this", "be", "are", "from", "or", "can", "each", "when", "one", "more", "than", "its",
    "cache", "block", "token", "model", "batch", "queue", "load", "route", "fleet", "gpu",
    "kv", "page", "input", "reply", "speed", "time", "step", "fast", "small", "large",
    "free", "used", "first", "next", "last", "long", "short", "rate", "cost", "limit",
    "lorem", "ipsum", "dolor", "sit", "amet", "which", "these", "then", "so", "we", "you",
)
_FULL_STOP_EVERY = 11  # a "." piece replaces roughly one word in this many


def _pieces(text: str) -> list[str]:
    out: list[str] = []
    for piece in PIECE_PATTERN.findall(text):
        if len(piece) <= MAX_PIECE_CHARS:
            out.append(piece)
        else:
            step = MAX_PIECE_CHARS
            out.extend(piece[i : i + step] for i in range(0, len(piece), step))
    return out


def tokenize(text: str) -> list[int]:
    """Token ids of `text` under the rule in the module docstring."""
    return [zlib.crc32(piece.encode()) & 0x7FFFFFFF for piece in _pieces(text)]


def count_tokens(text: str) -> int:
    """`len(tokenize(text))`, without computing the ids."""
    count = 0
    for piece in PIECE_PATTERN.findall(text):
        count += -(-len(piece) // MAX_PIECE_CHARS)
    return count


def natural_output_length(key: bytes, seed: int) -> int:
    """How many tokens the simulated model writes before it stops by itself (>= 1).

    A pure function of (key, seed): the same request content under the same seed always gets the
    same length. Heavy-tailed: log-normal with median NATURAL_MEDIAN_TOKENS.
    """
    digest = hashlib.blake2b(key, digest_size=8, salt=seed.to_bytes(16, "little", signed=True))
    # A uniform in the open interval (0, 1): never exactly 0 or 1, where inv_cdf is undefined.
    uniform = (int.from_bytes(digest.digest(), "little") + 0.5) / 2.0**64
    z = NormalDist().inv_cdf(uniform)
    return max(1, round(NATURAL_MEDIAN_TOKENS * math.exp(NATURAL_SIGMA * z)))


def _mix(seed: int, index: int) -> int:
    """A cheap, well-spread 32-bit hash of (seed, index) (Murmur3's finalizer)."""
    h = (seed ^ (index * 0x9E3779B1)) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def output_seed(key: bytes) -> int:
    """The seed `output_piece` derives from request content; compute it once per request."""
    return zlib.crc32(key)


def output_piece(seed: int, index: int) -> str:
    """Output piece number `index` (0-based) of the reply seeded by `output_seed(key)`.

    Each piece counts as exactly one token, and so does it inside any concatenation of pieces:
    words carry their leading space (except the capitalised first one) and a "." never follows a
    "." nor starts the reply, so the tokenizer's pieces are exactly these.
    """
    h = _mix(seed, index)
    if index == 0:
        return _WORDS[h % len(_WORDS)].capitalize()
    if h % _FULL_STOP_EVERY == 0 and _mix(seed, index - 1) % _FULL_STOP_EVERY != 0:
        return "."
    return " " + _WORDS[(h >> 8) % len(_WORDS)]


def output_pieces(key: bytes, n: int) -> list[str]:
    """The first `n` pieces of the reply for `key`; `count_tokens("".join(...)) == n`."""
    seed = output_seed(key)
    return [output_piece(seed, i) for i in range(n)]
