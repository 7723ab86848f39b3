"""The embedders: one protocol, vectors of unit length; the local model's files verified by
sha256 and run off the event loop, concurrent calls batched; the remote one failing open."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from gateway.cache.embed import hashed_vector
from gateway.cache.embedders import choice, local, remote
from gateway.cache.embedders.base import DenseBatch, DenseEmbedder, SparseEmbedder
from gateway.cache.embedders.batching import ThreadBatcher
from gateway.cache.embedders.hashing import HashingEmbedder
from gateway.cache.vectors import cosine

DATA = Path(local.__file__).parent / "data"


@pytest.fixture(scope="module")
def model() -> local.MiniLM:
    return local.MiniLM()


# -- choice -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("setting", "installed", "expected"), [
    pytest.param("auto", True, choice.Kind.LOCAL, id="auto is the local model when installed"),
    pytest.param("auto", False, choice.Kind.HASHING, id="auto is hashing without the extra"),
    pytest.param("hashing", True, choice.Kind.HASHING, id="hashing by name"),
    pytest.param("minilm", True, choice.Kind.LOCAL, id="minilm by name"),
    pytest.param("local", True, choice.Kind.LOCAL, id="local, its earlier name"),
    pytest.param("openai", False, choice.Kind.OPENAI, id="openai needs no extra"),
])
def test_resolve(setting: str, installed: bool, expected: choice.Kind) -> None:
    assert choice.resolve(setting, installed) is expected


@pytest.mark.parametrize("setting", ["bert", "", "LOCAL"])
def test_resolve_refuses_an_unknown_setting(setting: str) -> None:
    with pytest.raises(choice.EmbedderUnavailable, match="must be one of"):
        choice.resolve(setting, True)


def test_local_by_name_without_the_extra_is_an_error_not_hashing() -> None:
    with pytest.raises(choice.EmbedderUnavailable, match="kvgate\\[semantic\\]"):
        choice.resolve("local", False)


def test_the_extra_is_installed_in_dev() -> None:
    assert choice.local_installed()


# -- hashing ----------------------------------------------------------------------------------

async def test_hashing_embeds_a_batch_as_hashed_vector_does() -> None:
    embedder: SparseEmbedder = HashingEmbedder()
    texts = ["What is the capital of France?", "", "word " * 1000]
    vectors = await embedder.embed(texts)
    assert vectors == [hashed_vector(text, dimensions=embedder.dimensions) for text in texts]
    assert embedder.name == "hashing-v1"


# -- local: files -----------------------------------------------------------------------------

def test_the_shipped_tokenizer_is_the_one_its_checksum_file_names() -> None:
    digest = hashlib.sha256((DATA / local.TOKENIZER_FILE).read_bytes()).hexdigest()
    written = (DATA / f"{local.TOKENIZER_FILE}.sha256").read_text().split()[0]
    assert digest == written == local.TOKENIZER_SHA256
    assert "Apache License" in (DATA / "LICENSE-minilm-tokenizer.txt").read_text()
    assert local.shipped_tokenizer() == DATA / local.TOKENIZER_FILE


def test_the_model_is_found_in_its_installed_package() -> None:
    path = local.installed_model()
    assert path.is_file() and "site-packages" in path.parts
    local.verified(path, local.MODEL_SHA256)


@pytest.mark.parametrize("which", ["model", "tokenizer"])
def test_a_file_with_other_bytes_is_refused(which: str, tmp_path: Path) -> None:
    source = local.installed_model() if which == "model" else local.shipped_tokenizer()
    copy = tmp_path / source.name
    shutil.copyfile(source, copy)
    with copy.open("ab") as file:
        file.write(b" ")
    paths = {"model_path": copy} if which == "model" else {"tokenizer_path": copy}
    with pytest.raises(local.ModelFileError, match="sha256"):
        local.MiniLM(**paths)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(local.ModelFileError, match="missing.onnx"):
        local.MiniLM(model_path=tmp_path / "missing.onnx")


def test_an_identical_copy_elsewhere_is_accepted(tmp_path: Path) -> None:
    copy = tmp_path / "tokenizer.json"
    shutil.copyfile(local.shipped_tokenizer(), copy)
    assert local.MiniLM(tokenizer_path=copy).encode(["hi"]).shape == (1, local.DIMENSIONS)


@pytest.mark.parametrize(("given", "expected"), [
    pytest.param(None, (None, None), id="nothing given: the installed copies"),
    pytest.param("model.onnx", ("model.onnx", None), id="a file: the model"),
    pytest.param(".", ("model.onnx", "tokenizer.json"), id="a directory: both files in it"),
    pytest.param("empty", (None, None), id="a directory without them: the installed copies"),
])
def test_embedder_path_locates_the_files(given: str | None, expected: tuple[str | None, ...],
                                         tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    found = local.located(None if given is None else tmp_path / given)
    assert found == tuple(None if name is None else tmp_path / name for name in expected)


def test_build_makes_each_kind() -> None:
    settings = choice.EmbedderSettings
    assert isinstance(choice.build(settings(choice.Kind.HASHING)), HashingEmbedder)
    assert isinstance(choice.build(settings(choice.Kind.LOCAL)), local.LocalEmbedder)
    built = choice.build(settings(choice.Kind.OPENAI, url="http://127.0.0.1:1", model="m"))
    assert isinstance(built, remote.RemoteEmbedder)
    with pytest.raises(choice.EmbedderUnavailable, match="embedder_url"):
        choice.build(settings(choice.Kind.OPENAI, model="m"))


# -- local: vectors ---------------------------------------------------------------------------

def test_vectors_are_384_float32_of_unit_length(model: local.MiniLM) -> None:
    batch = model.encode(["How do I reset my password?", "", "a " * 600])
    assert batch.shape == (3, 384) and batch.dtype == np.float32
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert model.encode([]).shape == (0, 384)


def test_a_texts_vector_does_not_depend_on_its_batch(model: local.MiniLM) -> None:
    alone = model.encode(["short question"])[0]
    batched = model.encode(["a much longer question with many more tokens than the short one",
                            "short question"])[1]
    assert float(alone @ batched) == pytest.approx(1.0, abs=1e-5)


def test_meaning_not_wording_decides_the_similarity(model: local.MiniLM) -> None:
    question, paraphrase, other = model.encode([
        "How can I make my bread rise more?", "What makes bread dough rise better?",
        "Which planets have rings?"])
    assert float(question @ paraphrase) > float(question @ other) + 0.3


def test_padding_is_off_and_truncation_at_256(model: local.MiniLM) -> None:
    assert model.token_counts(["hello"]) == [3]  # [CLS] hello [SEP], not padded to 128
    long = "word " * 400
    assert model.token_counts([long])[0] > local.MAX_TOKENS
    assert not model.fits(long) and model.fits("word " * 200)
    # Text past the window changes nothing: it was cut off.
    head = "word " * 300
    first, second = model.encode([head + "alpha beta gamma", head + "delta epsilon"])
    assert float(first @ second) == pytest.approx(1.0, abs=1e-5)


# -- local: off the event loop, batched -------------------------------------------------------

class CountingModel:
    """A MiniLM that records the thread and the texts of each run."""

    def __init__(self, model: local.MiniLM) -> None:
        self.model = model
        self.batches: list[list[str]] = []
        self.threads: set[int] = set()
        self.release = threading.Event()

    def encode(self, texts: Sequence[str]) -> DenseBatch:
        self.threads.add(threading.get_ident())
        self.batches.append(list(texts))
        self.release.wait(timeout=30)
        return self.model.encode(texts)


async def test_the_model_runs_in_one_worker_thread_with_concurrent_calls_batched(
        model: local.MiniLM) -> None:
    counting = CountingModel(model)
    batcher: ThreadBatcher[np.float32] = ThreadBatcher(counting.encode, max_texts=8)
    first = asyncio.ensure_future(batcher(["one"]))
    deadline = time.monotonic() + 30
    while not counting.batches:  # the first batch is running (and held) in the worker
        assert time.monotonic() < deadline, "the worker never started the first batch"
        await asyncio.sleep(0.001)
    rest = [asyncio.ensure_future(batcher([f"text {n}", f"more {n}"])) for n in range(6)]
    await asyncio.sleep(0)  # one turn of the loop: each call has joined the pending list
    counting.release.set()
    results = await asyncio.gather(first, *rest)
    assert [len(batch) for batch in counting.batches] == [1, 8, 4]  # 6 calls: 2 batches
    assert [result.shape for result in results] == [(1, 384)] + [(2, 384)] * 6
    assert threading.get_ident() not in counting.threads and len(counting.threads) == 1
    expected = model.encode(["text 3", "more 3"])
    assert np.allclose(results[4], expected, atol=1e-5)  # each call gets its own rows
    batcher.close()


async def test_an_error_fails_its_batch_and_a_cancelled_caller_leaves_the_rest() -> None:
    calls: list[list[str]] = []

    def compute(texts: list[str]) -> DenseBatch:
        calls.append(texts)
        if "boom" in texts:
            raise RuntimeError("boom")
        return np.ones((len(texts), 2), dtype=np.float32)

    batcher: ThreadBatcher[np.float32] = ThreadBatcher(compute)
    with pytest.raises(RuntimeError, match="boom"):
        await batcher(["boom"])
    gone = asyncio.ensure_future(batcher(["a"]))
    kept = asyncio.ensure_future(batcher(["b", "c"]))
    await asyncio.sleep(0)
    gone.cancel()
    assert (await kept).shape == (2, 2)
    assert (await batcher([])).shape == (0, 2)
    batcher.close()


async def test_the_local_embedder_follows_the_protocol(model: local.MiniLM) -> None:
    embedder: DenseEmbedder = local.LocalEmbedder(model)
    batch = await embedder.embed(["a question", "another"])
    assert batch is not None and batch.shape == (2, embedder.dimensions)
    assert embedder.name == local.NAME
    assert np.allclose(batch, model.encode(["a question", "another"]), atol=1e-6)


# -- remote -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "expected"), [
    ("http://h:8000", "http://h:8000/v1/embeddings"),
    ("http://h:8000/", "http://h:8000/v1/embeddings"),
    ("http://h:8000/v1", "http://h:8000/v1/embeddings"),
    ("http://h/api/v1/embeddings", "http://h/api/v1/embeddings"),
    ("http://h/openai", "http://h/openai/v1/embeddings"),
])
def test_endpoint(url: str, expected: str) -> None:
    assert remote.endpoint(url) == expected


class EmbeddingServer:
    """An OpenAI-compatible /v1/embeddings on loopback: vectors [len(text), 1, 0] (unnormalised),
    listed in reverse index order; `mode` makes it fail in one way."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[dict[str, object]] = []
        self.never = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.mode == "error":
            return web.json_response({"error": "overloaded"}, status=503)
        if self.mode == "malformed":
            return web.json_response({"data": [{"index": 0}]})
        if self.mode == "hang":
            await self.never.wait()
        texts = body["input"]
        data = [{"index": i, "embedding": [float(len(t)), 1.0, 0.0]} for i, t in enumerate(texts)]
        return web.json_response({"data": data[::-1], "model": body["model"]})


@pytest.fixture
async def embedding_server() -> AsyncIterator[tuple[EmbeddingServer, str]]:
    server = EmbeddingServer()
    app = web.Application()
    app.router.add_post("/v1/embeddings", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield server, f"http://127.0.0.1:{port}"
    server.never.set()
    await runner.cleanup()


async def test_remote_vectors_come_back_in_order_and_normalised(
        embedding_server: tuple[EmbeddingServer, str]) -> None:
    server, url = embedding_server
    embedder = remote.RemoteEmbedder(url, "e5-small", api_key="k")
    batch = await embedder.embed(["abc", "a"])
    assert batch is not None
    assert np.allclose(batch[0], np.array([3, 1, 0]) / np.sqrt(10), atol=1e-6)
    assert np.allclose(batch[1], np.array([1, 1, 0]) / np.sqrt(2), atol=1e-6)
    assert server.requests == [{"model": "e5-small", "input": ["abc", "a"]}]
    assert embedder.dimensions == 3 and embedder.name == "openai:e5-small"
    await embedder.close()


@pytest.mark.parametrize("mode", ["error", "malformed", "hang"])
async def test_remote_fails_open(mode: str, embedding_server: tuple[EmbeddingServer, str]
                                 ) -> None:
    server, url = embedding_server
    server.mode = mode
    embedder = remote.RemoteEmbedder(url, "m", timeout_s=0.2)
    assert await embedder.embed(["question"]) is None
    assert embedder.failures == 1
    await embedder.close()


async def test_remote_fails_open_when_nothing_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        embedder = remote.RemoteEmbedder(f"http://127.0.0.1:{port}", "m")
        assert await embedder.embed(["question"]) is None
    await embedder.close()


async def test_remote_refuses_vectors_of_another_length(
        embedding_server: tuple[EmbeddingServer, str]) -> None:
    _, url = embedding_server
    embedder = remote.RemoteEmbedder(url, "m", dimensions=384)
    assert await embedder.embed(["question"]) is None
    await embedder.close()


@pytest.mark.parametrize(("body", "count", "message"), [
    (b"{}", 1, "not an embeddings reply"),
    (b'{"data": [{"index": 1, "embedding": [1.0]}]}', 1, "indices"),
    (b'{"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]}', 2,
     "lengths"),
    (b'{"data": [{"index": 0, "embedding": []}]}', 1, "lengths"),
])
def test_parse_reply_refuses(body: bytes, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        remote.parse_reply(body, count, 0)


def test_sparse_and_dense_similarities_agree_on_the_same_vectors() -> None:
    dense = np.array([0.6, 0.8, 0.0], dtype=np.float32)
    other = np.array([0.0, 0.6, 0.8], dtype=np.float32)
    sparse = {index: float(value) for index, value in enumerate(dense) if value}
    sparse_other = {index: float(value) for index, value in enumerate(other) if value}
    assert cosine(sparse, sparse_other) == pytest.approx(float(dense @ other))
