"""The protocol every embedder follows, and the shapes of what they return.

An embedder turns a batch of texts into one vector per text, in order. `name` names its vector
space: vectors of two embedders (or two versions of one) are never compared, so a stored vector
carries the name it was made under and a lookup compares only vectors of its own embedder's
name. `dimensions` is the length of its vectors (a sparse embedder's indices lie below it).

Vectors are L2-normalised, so a cosine is a dot product. A text with nothing to embed (no words)
gives the zero vector, which matches nothing.

`embed` returns None when the embedder cannot answer now (a remote endpoint down or slow): the
caller then skips the semantic tier for that request, failing open as the store does. A local
embedder never returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

from gateway.cache.vectors import Vector

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    # A batch of dense vectors: shape (len(texts), dimensions), float32, rows of unit length.
    DenseBatch: TypeAlias = npt.NDArray[np.float32]
else:
    DenseBatch = object

SparseBatch: TypeAlias = list[Vector]  # one sparse vector per text (see gateway/cache/vectors.py)

BatchT_co = TypeVar("BatchT_co", covariant=True)


class Embedder(Protocol[BatchT_co]):
    """Texts to vectors. `Embedder[SparseBatch]` or `Embedder[DenseBatch]`."""

    @property
    def name(self) -> str:
        """The vector space's name: changes whenever its vectors would."""
        ...

    @property
    def dimensions(self) -> int:
        """The length of its vectors."""
        ...

    async def embed(self, texts: Sequence[str]) -> BatchT_co | None:
        """One vector per text, in order; None when the embedder cannot answer now."""
        ...


SparseEmbedder: TypeAlias = Embedder[SparseBatch]
DenseEmbedder: TypeAlias = Embedder["DenseBatch"]
