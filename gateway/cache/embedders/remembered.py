"""The local model's vectors of the last few texts, remembered: one embedding per request.

The gateway embeds a request's question twice over when small-model routing's classifier and
the semantic cache both read it (the classifier first, to choose the model; the cache's lookup
next, keyed by the model chosen). `Remembered` sits in front of the cache's `LocalEmbedder`,
which the classifier then shares: it keeps the vectors of the last `size` texts it embedded, so
the second reading of a question is a dictionary lookup, not a second run of the model. A text's
vector does not depend on its batch (gateway/cache/embedders/local.py), so a remembered vector is
the one the model would give again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from gateway.cache.embedders.base import DenseBatch
from gateway.cache.embedders.local import DIMENSIONS, LocalEmbedder, MiniLM

REMEMBERED = 64  # texts: a few requests' worth under any concurrency the model keeps up with


class Remembered:
    """A `LocalEmbedder` that remembers the vectors of the last `size` texts it embedded."""

    __slots__ = ("_embedder", "_rows", "_size", "computed", "recalled")

    def __init__(self, embedder: LocalEmbedder, *, size: int = REMEMBERED) -> None:
        self._embedder = embedder
        self._rows: OrderedDict[str, DenseBatch] = OrderedDict()
        self._size = max(1, size)
        self.computed = 0  # texts the model embedded
        self.recalled = 0  # texts answered from memory

    @property
    def name(self) -> str:
        return self._embedder.name

    @property
    def dimensions(self) -> int:
        return self._embedder.dimensions

    @property
    def model(self) -> MiniLM:
        return self._embedder.model

    async def embed(self, texts: Sequence[str]) -> DenseBatch:
        rows = self._rows
        # What is remembered now: another call may forget it while this one waits for the model.
        found = {text: rows[text] for text in texts if text in rows}
        missing = [text for text in dict.fromkeys(texts) if text not in found]
        self.recalled += len(texts) - len(missing)
        if missing:
            batch = await self._embedder.embed(missing)
            self.computed += len(missing)
            found.update(zip(missing, batch, strict=True))
        result = [found[text] for text in texts]
        for text in texts:
            rows[text] = found[text]
            rows.move_to_end(text)
        while len(rows) > self._size:
            rows.popitem(last=False)
        if not result:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        stacked: DenseBatch = np.stack(result).astype(np.float32, copy=False)
        return stacked

    def close(self) -> None:
        self._embedder.close()
