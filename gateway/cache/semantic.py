"""The semantic tier's two helpers: one question's vector, and the guard's view of candidates.

`Questions` turns any `embedders.base.Embedder` (batch in, batch out; sparse or dense) into the
one-question calls the cache makes: `embed(text)` is the question's `Vector` (a dense row as its
dimensions 0..n-1) or None when the embedder cannot answer now (failing open), and `fits(text)`
says whether the text is embedded whole: a question cut at the model's window is not compared at
all, since its vector does not say what its tail asks. Concurrent calls are batched by the
embedder itself; a model runs in its worker thread, never on the event loop.

`Vetting` is the near-miss guard (gateway/cache/guard.py) as a store's `admits` check: the
cached question's features are read once per entry (kept by entry id, a bounded LRU) and the new
question's once per lookup; a veto passes the candidate over for the next best, up to
`MAX_VETTED` candidates a lookup.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from gateway.cache import guard
from gateway.cache.store import Entry
from gateway.cache.vectors import Vector

# A text this short fits any window (a WordPiece token covers at least one character, and two
# tokens are the model's own markers); one this long is taken not to fit, without tokenizing it.
SURELY_FITS_CHARS = 254
NEVER_FITS_CHARS = 8192
SPARSE_DIMENSIONS = 1 << 20
FEATURES_KEPT = 16_384  # cached questions' guard features kept in memory
RECENT_KEPT = 1024  # new questions' features, kept until their answers are stored
# The nearest candidates the guard reads for one lookup: when this many stored questions, each
# above the threshold, all differ decisively from the new one, it belongs to a family of
# questions that differ in what decides the answer (a number, a name), and is taken as new.
MAX_VETTED = 3


class BatchEmbedder(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> Any: ...


class Questions:
    """One question at a time over a batch embedder."""

    __slots__ = ("_embedder", "_window", "dense")

    def __init__(self, embedder: BatchEmbedder) -> None:
        self._embedder = embedder
        model = getattr(embedder, "model", None)
        self._window = getattr(model, "fits", None)  # the local model's: a window in tokens
        # The hashing embedder's space is 2**20 sparse dimensions; a model's (0: not known yet,
        # a remote one's) is a few hundred dense ones.
        self.dense = embedder.dimensions < SPARSE_DIMENSIONS

    @property
    def name(self) -> str:
        return self._embedder.name

    @property
    def dimensions(self) -> int:
        return self._embedder.dimensions

    @property
    def embedder(self) -> BatchEmbedder:
        return self._embedder

    async def embed(self, text: str) -> Vector | None:
        batch = await self._embedder.embed([text])
        if batch is None or len(batch) == 0:
            return None
        row = batch[0]
        if isinstance(row, dict):
            return row
        return {index: value for index, value in enumerate(row.tolist()) if value != 0.0}

    async def fits(self, text: str) -> bool:
        if self._window is None or len(text) <= SURELY_FITS_CHARS:
            return True
        if len(text) > NEVER_FITS_CHARS:
            return False
        return bool(await asyncio.to_thread(self._window, text))

    async def close(self) -> None:
        close = getattr(self._embedder, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result


class Vetting:
    """The guard over candidates of one process's lookups. A cached question's features are
    read when it is first a candidate (most stored questions never are), or taken from the
    lookup that met candidates for it as a new question (`recent`)."""

    __slots__ = ("_kept", "_recent", "vetoes")

    def __init__(self) -> None:
        self._kept: OrderedDict[str, guard.Question] = OrderedDict()
        self._recent: OrderedDict[str, guard.Question] = OrderedDict()  # by question text
        self.vetoes = 0  # candidates refused, for tests and logs

    def recent(self, question: str, features: guard.Question) -> None:
        """A new question's features, read by a lookup: its answer, once stored, needs them."""
        self._recent[question] = features
        if len(self._recent) > RECENT_KEPT:
            self._recent.popitem(last=False)

    def admits_for(self, question: str) -> Admitter:
        return Admitter(self, question)

    def features(self, entry: Entry) -> guard.Question:
        found = self._kept.get(entry.id)
        if found is None:
            found = self._recent.pop(entry.query, None) or guard.features(entry.query)
            self._kept[entry.id] = found
            if len(self._kept) > FEATURES_KEPT:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(entry.id)
        return found


class Admitter:
    """`admits(entry)` for one new question: the guard finds nothing decisive that differs."""

    __slots__ = ("_vetting", "_question", "_features", "_vetted")

    def __init__(self, vetting: Vetting, question: str) -> None:
        self._vetting = vetting
        self._question = question
        self._features: guard.Question | None = None
        self._vetted = 0

    def __call__(self, entry: Entry) -> bool:
        if entry.query == self._question:
            return True
        if self._vetted >= MAX_VETTED:
            return False
        self._vetted += 1
        if self._features is None:
            self._features = guard.features(self._question)
            self._vetting.recent(self._question, self._features)
        if guard.compare(self._features, self._vetting.features(entry)) is None:
            return True
        self._vetting.vetoes += 1
        return False
