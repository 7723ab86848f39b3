"""An OpenAI-compatible `/v1/embeddings` endpoint as an `Embedder` (`cache.embedder: openai`).

What a fleet that already serves an embedding model uses: one POST per batch,
`{"model": ..., "input": [texts]}`, the vectors read from `data[].embedding` in `index` order and
L2-normalised here (servers differ in whether they normalise). Fails open, like the store: a
refused connection, a timeout, an error status or a malformed reply makes `embed` return None,
and the caller goes without the semantic tier for that request; nothing is raised and nothing
is retried. `failures` counts those.

The vector space is named after the model (`openai:<model>`): two endpoints serving the same
model give comparable vectors; a different model never compares with them. `dimensions` is the
configured one, or else learned from the first reply (0 until then); a reply of another length
is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import numpy as np
import pydantic

from gateway.cache.embedders.base import DenseBatch

DEFAULT_TIMEOUT_S = 2.0


class _Item(pydantic.BaseModel):
    index: int
    embedding: list[float]


class _Reply(pydantic.BaseModel):
    data: list[_Item]


def endpoint(url: str) -> str:
    """The embeddings endpoint of `url`: as given when its path ends in `/embeddings`, else
    `/embeddings` after a path ending in `/v1`, else `/v1/embeddings` after the path."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if not path.endswith("/embeddings"):
        path += "/embeddings" if path.endswith("/v1") else "/v1/embeddings"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def parse_reply(body: bytes, count: int, dimensions: int) -> DenseBatch:
    """The normalised (count, d) batch of a reply; ValueError when it is not `count` vectors of
    one length (`dimensions`, when that is not 0)."""
    try:
        reply = _Reply.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise ValueError(f"not an embeddings reply: {exc.error_count()} errors") from exc
    items = sorted(reply.data, key=lambda item: item.index)
    if [item.index for item in items] != list(range(count)):
        raise ValueError(f"expected indices 0..{count - 1}, got {[i.index for i in items]}")
    lengths = {len(item.embedding) for item in items}
    if len(lengths) > 1 or (dimensions and lengths != {dimensions}) or 0 in lengths:
        raise ValueError(f"vectors of lengths {sorted(lengths)}, expected {dimensions or 'one'}")
    batch = np.asarray([item.embedding for item in items], dtype=np.float32)
    if count == 0:
        return batch.reshape(0, dimensions)
    if not np.isfinite(batch).all():
        raise ValueError("a vector with a non-finite value")
    norms = np.linalg.norm(batch, axis=1, keepdims=True)
    result: DenseBatch = (batch / np.maximum(norms, 1e-12)).astype(np.float32)
    return result


class RemoteEmbedder:
    __slots__ = ("_url", "_model", "_dimensions", "_timeout", "_headers", "_session",
                 "failures")

    def __init__(self, url: str, model: str, *, dimensions: int = 0, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not model:
            raise ValueError("the remote embedder needs a model name")
        self._url = endpoint(url)
        self._model = model
        self._dimensions = dimensions
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self.failures = 0

    @property
    def name(self) -> str:
        return f"openai:{self._model}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def url(self) -> str:
        return self._url

    async def embed(self, texts: Sequence[str]) -> DenseBatch | None:
        if not texts:
            return np.zeros((0, self._dimensions), dtype=np.float32)
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        try:
            async with self._session.post(
                    self._url, json={"model": self._model, "input": list(texts)}) as response:
                if response.status != 200:
                    raise ValueError(f"status {response.status}")
                body = await response.read()
            batch = parse_reply(body, len(texts), self._dimensions)
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError):
            self.failures += 1
            return None
        self._dimensions = batch.shape[1]
        return batch

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
