"""The built-in embedder: hashed lexical features that find near-duplicate questions, no model.

`hashed_vector(text)` is pure and deterministic across processes and machines (blake2b, never
Python's salted `hash`), so vectors one gateway wrote to Redis compare with another's. Changing a
weight, the stopwords or the tokeniser changes every vector: stored entries stop matching (the
exact tier is unaffected), so such a change wants a cache flush.
`HashingEmbedder` gives it the async `embed(text)` shape an embedding-model client has.

It measures how much wording two texts share, not what they mean: it is for near-duplicates
("What is the capital of France?" vs "what's the capital of france": 1.0) and must keep apart
questions that differ in one decisive word ("... of France?" vs "... of Spain?": 0.57; "sort a list
in Python" vs "in Java": 0.78, the closest call, as 3 of its 4 content words are shared).

Text is NFKC-normalised and casefolded; typographic apostrophes become "'", contractions are
expanded ("what's" -> "what is", "don't"/"dont" -> "do not", "can't"/"cannot" -> "can not"), a
possessive "'s" and any other apostrophe are dropped, and so is punctuation, except where
dropping it would merge questions with different answers:
- "c++", "c#", "f#" stay themselves, not "c" and "f";
- arithmetic is one token with its operators, spaces removed ("2 + 2" is "2+2", not "2*2");
- numbers ("3.14", "6789") and arithmetic are unigrams only: trigrams would make 6788 like 6789.

Features, summed, then L2-normalised:
- word unigrams, weight w;
- the word's character trigrams with boundary marks ("<fr", "fra", ... "ce>"), w / sqrt(count)
  each, so every word carries the same trigram mass whatever its length;
- word bigrams, weight BIGRAM * (w1 + w2) / 2: enough word order that "Celsius to Fahrenheit" vs
  "Fahrenheit to Celsius" falls under 0.9 (0.87) while a clause moved in a long question stays
  above it (0.95).
w is 1 for content words and STOPWORD (0.2) for common English function words. Negations ("not",
"no", "never") and the question words that change the question ("how", "why", "when", "where",
"who") are content words: "Why does ..." vs "How does ..." is 0.78, not 0.95.
Unigrams and trigrams are blake2b (8 bytes) of the feature; a bigram's 64 bits are mixed from its
two words' digests, saving a hash per word. The low bit of a digest is the feature's sign, the
rest modulo `dimensions` its index.

Cost, mostly hashing: a 200-word text takes ~0.7 ms with its words seen before (a bounded memo
keeps the last 8192 words' features) and ~2.5 ms with all new words, on a slow 2-core box.
"""

from __future__ import annotations

import asyncio
import math
import re
import unicodedata
from functools import lru_cache
from hashlib import blake2b

from gateway.cache.vectors import Vector, normalised

STOPWORD = 0.2  # weight of a stopword relative to a content word
BIGRAM = 1.0  # weight of a bigram relative to its two words' mean weight
# Longest text embedded on the event loop (about 1 ms warm); longer ones, up to ~0.5 us a char
# with known words and ~4 us with new ones (a pasted document), go to a worker thread.
INLINE_CHARS = 2048

_STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his i if in into is it its itself just me
more most my myself of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what which while whom will with would you your
yours yourself yourselves please tell
""".split())

_APOSTROPHES = re.compile("[\u2018\u2019\u201b\u02bc\u02b9`\u00b4\u2032]")
_WHOLE_CONTRACTIONS = {
    "can't": "can not", "cannot": "can not", "won't": "will not", "shan't": "shall not",
    "ain't": "is not", "let's": "let us",
    # Common spellings without the apostrophe, where they are not also ordinary words.
    "dont": "do not", "doesnt": "does not", "didnt": "did not", "isnt": "is not",
    "arent": "are not", "wasnt": "was not", "werent": "were not", "couldnt": "could not",
    "shouldnt": "should not", "wouldnt": "would not", "havent": "have not", "hasnt": "has not",
    "hadnt": "had not", "whats": "what is", "thats": "that is",
}
_WHOLE = re.compile(r"\b(?:" + "|".join(map(re.escape, _WHOLE_CONTRACTIONS)) + r")\b")
_IS = re.compile(r"\b(it|that|what|where|who|how|there|here|he|she|when|why|this)'s\b")
_SUFFIXES = {"n't": " not", "'re": " are", "'ve": " have", "'ll": " will", "'m": " am",
             "'d": " would", "'s": ""}  # a remaining "'s" is a possessive: "france's" -> "france"
_SUFFIX = re.compile(r"(?:n't|'re|'ve|'ll|'m|'d|'s)\b")
_NUMBER = r"\d+(?:[.,]\d+)*"
_TOKEN = re.compile(
    rf"{_NUMBER}(?:\s*[-+*/^%=<>×÷]\s*{_NUMBER})+"  # arithmetic: one token, spaces dropped below
    r"|[^\W\d_]\w*(?:\+\+|#)(?![\w+#])"  # c++, c#, f#
    rf"|{_NUMBER}(?![^\W\d_])"  # a number, unless it starts a word like "3d"
    r"|\w+"
)
_MASK = (1 << 64) - 1


def hashed_vector(text: str, *, dimensions: int = 1 << 20) -> Vector:
    """The normalised hashed-feature vector of `text`; empty when it has no words."""
    if dimensions < 1:
        raise ValueError(f"dimensions must be positive, not {dimensions}")
    words = _words(text)
    weights = [STOPWORD if word in _STOPWORDS else 1.0 for word in words]
    digests: list[int] = []
    vector: Vector = {}
    get = vector.get
    for word, weight in zip(words, weights, strict=True):
        digest, features = _word_features(word, dimensions)
        digests.append(digest)
        for index, value in features:
            vector[index] = get(index, 0.0) + weight * value
    for position in range(len(words) - 1):
        weight = BIGRAM * (weights[position] + weights[position + 1]) / 2
        index, sign = _signed_index(_pair(digests[position], digests[position + 1]), dimensions)
        vector[index] = get(index, 0.0) + sign * weight
    return normalised(vector)


class HashingEmbedder:
    """The built-in embedder: `hashed_vector` behind the async shape a model client has."""

    # Names the vector space: stored vectors are compared only with vectors of the same name, so
    # a change to the features, weights or stopwords must change the version.
    name: str = "hashing-v1"

    async def embed(self, text: str) -> Vector:
        """`hashed_vector(text)`; a text long enough to hold the event loop runs in a thread."""
        if len(text) <= INLINE_CHARS:
            return hashed_vector(text)
        return await asyncio.to_thread(hashed_vector, text)


def _words(text: str) -> list[str]:
    text = _APOSTROPHES.sub("'", unicodedata.normalize("NFKC", text).casefold())
    text = _WHOLE.sub(lambda match: _WHOLE_CONTRACTIONS[match.group()], text)
    text = _IS.sub(r"\1 is", text)
    text = _SUFFIX.sub(lambda match: _SUFFIXES[match.group()], text)
    return ["".join(token.split()) if token[0].isdigit() else token
            for token in _TOKEN.findall(text.replace("'", ""))]


# Memoised because the same words recur in nearly every text (hashing is most of the cost): a
# bounded map from a word to what it always gives, invisible in results; 8192 words, a few MB.
@lru_cache(maxsize=1 << 13)
def _word_features(word: str, dimensions: int) -> tuple[int, tuple[tuple[int, float], ...]]:
    """The word's digest and its (index, value) features at weight 1: unigram and trigrams."""
    digest = _digest("w" + word)
    features = [_signed_index(digest, dimensions)]
    if not word[0].isdigit():  # numbers and arithmetic match exactly or not at all
        marked = f"<{word}>"
        count = max(1, len(marked) - 2)
        share = 1.0 / math.sqrt(count)
        for start in range(count):
            index, sign = _signed_index(_digest("c" + marked[start:start + 3]), dimensions)
            features.append((index, sign * share))
    return digest, tuple(features)


def _digest(feature: str) -> int:
    return int.from_bytes(blake2b(feature.encode(), digest_size=8).digest(), "little")


def _pair(first: int, second: int) -> int:
    """A bigram's digest from its words' (splitmix64's finaliser): ordered, and no second hash."""
    mixed = ((first * 0x9E3779B97F4A7C15) ^ second) & _MASK
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK
    return mixed ^ (mixed >> 31)


def _signed_index(digest: int, dimensions: int) -> tuple[int, float]:
    """Where a feature lands and with which sign: the digest's low bit is the sign."""
    return (digest >> 1) % dimensions, 1.0 if digest & 1 else -1.0
