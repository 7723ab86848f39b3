"""The hashing embedder (`gateway/cache/embed.py`'s hashed lexical features) as an `Embedder`.

Sparse vectors in a space of 2**20 dimensions, deterministic across processes. It measures shared
wording, not meaning: it finds surface variants of a question (case, punctuation, contractions,
word order within a clause) and cannot tell a paraphrase from a one-word change that flips the
answer, which is the guard's job. A batch whose texts are short enough is embedded on the event
loop (well under a millisecond each); a longer batch goes to a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gateway.cache import embed
from gateway.cache.embed import INLINE_CHARS, hashed_vector
from gateway.cache.embedders.base import SparseBatch

DIMENSIONS = 1 << 20
# The same space as the single-text embedder's, so vectors either one stored compare.
NAME = embed.HashingEmbedder.name


class HashingEmbedder:
    """`hashed_vector` for a batch of texts."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return NAME

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    async def embed(self, texts: Sequence[str]) -> SparseBatch:
        if sum(map(len, texts)) <= INLINE_CHARS:
            return embed_all(texts)
        return await asyncio.to_thread(embed_all, list(texts))


def embed_all(texts: Sequence[str]) -> SparseBatch:
    """The hashed vectors of `texts`, synchronously."""
    return [hashed_vector(text, dimensions=DIMENSIONS) for text in texts]
