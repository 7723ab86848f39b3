"""The semantic tier's two costs on one core: embedding a prompt, and searching a namespace.

    python -m loadtest.bench_embed [--runs 50] [--lengths 8,32,64,128,200]
                                   [--sizes 10000,50000] [--lookups 400]
                                   [--sparse-members 2000] [--cpu N] [--no-record]

Embedding: the local model (all-MiniLM-L6-v2, int8, one onnxruntime thread) and the hashing
embedder, per prompt length in words, one text at a time (what a lookup pays) and per text in a
batch of 8 (what concurrent lookups pay once batched). Search: `DenseIndex` over N random unit
vectors of 384 dimensions, half the queries near a member (hits at 0.85), half random (misses),
p50 and p99 per lookup; then both `DenseIndex` and the sparse `SemanticIndex` on the same
vectors and queries, side by side (a smaller namespace: the sparse index walks every member's
384 postings). BLAS and onnxruntime run one thread each; `--cpu N` binds the process to CPU N.
Figures go to `loadtest/results/bench_embed.json` (`--no-record` leaves it alone).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from gateway.cache.dense_index import DenseIndex
from gateway.cache.embed import hashed_vector
from gateway.cache.index import SemanticIndex
from loadtest.results import Table, record

WORDS = ("cache model token answer question server memory route python list sort river "
         "mountain history music weather capital network latency budget account password "
         "reset change file folder network queue thread socket").split()
LENGTHS = (8, 32, 64, 128, 200)
DIMENSIONS = 384
THRESHOLD = 0.85
BATCH = 8


def prompt(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "?"


def percentile(samples: Sequence[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def timings(function: Callable[[], object], runs: int) -> list[float]:
    function()  # warm
    found = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        found.append(time.perf_counter() - started)
    return found


def embedding_rows(lengths: Sequence[int], runs: int, rng: random.Random) -> list[list[object]]:
    from gateway.cache.embedders.local import MiniLM

    model = MiniLM()
    rows: list[list[object]] = []
    for length in lengths:
        texts = [prompt(length, rng) for _ in range(BATCH)]
        tokens = model.token_counts(texts[:1])[0]
        one = timings(partial(model.encode, texts[:1]), runs)
        batch = timings(partial(model.encode, texts), max(3, runs // BATCH))
        hashing = timings(partial(hashed_vector, texts[0]), runs)  # its words seen before
        rows.append([length, tokens, round(statistics.median(one) * 1e3, 2),
                     round(percentile(one, 0.99) * 1e3, 2),
                     round(statistics.median(batch) / BATCH * 1e3, 2),
                     round(statistics.median(hashing) * 1e3, 3)])
    return rows


def search_rows(sizes: Sequence[int], lookups: int, rng: random.Random) -> list[list[object]]:
    generator = np.random.default_rng(rng.randrange(1 << 30))
    rows: list[list[object]] = []
    for size in sizes:
        vectors = generator.normal(size=(size, DIMENSIONS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        index = DenseIndex(DIMENSIONS, max_members=size)
        for number, vector in enumerate(vectors):
            index.add(f"m{number}", vector, float(number))
        half = lookups // 2
        near = vectors[generator.integers(0, size, half)] + 0.02 * generator.normal(
            size=(half, DIMENSIONS)).astype(np.float32)
        far = generator.normal(size=(lookups - half, DIMENSIONS)).astype(np.float32)
        queries = np.concatenate([near, far]).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        samples = []
        hits = 0
        for query in queries:
            started = time.perf_counter()
            found = index.best(query, THRESHOLD)
            samples.append(time.perf_counter() - started)
            hits += found is not None
        rows.append([size, round(percentile(samples, 0.5) * 1e3, 3),
                     round(percentile(samples, 0.99) * 1e3, 3), hits,
                     round(size * DIMENSIONS * 4 / 2**20, 1)])
    return rows


def side_by_side(members: int, lookups: int, rng: random.Random) -> list[list[object]]:
    """Both indexes on the same `members` vectors and queries: median ms per lookup, ratio."""
    generator = np.random.default_rng(rng.randrange(1 << 30))
    vectors = generator.normal(size=(members, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    dense = DenseIndex(DIMENSIONS, max_members=members)
    sparse = SemanticIndex()
    for number, vector in enumerate(vectors):
        dense.add(f"m{number}", vector, float(number))
        sparse.add(f"m{number}", dict(enumerate(vector.tolist())), float(number))
    queries = vectors[:lookups] + 0.02 * generator.normal(size=(lookups, DIMENSIONS))
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    dense_samples, sparse_samples = [], []
    for query in queries:
        started = time.perf_counter()
        found = dense.best(query, THRESHOLD)
        dense_samples.append(time.perf_counter() - started)
        started = time.perf_counter()
        expected = sparse.best(dict(enumerate(query.tolist())), THRESHOLD)
        sparse_samples.append(time.perf_counter() - started)
        if (found is None) != (expected is None) or (
                found is not None and expected is not None and found[0] != expected[0]):
            raise SystemExit("the dense and sparse indexes disagree")
    fast, slow = statistics.median(dense_samples), statistics.median(sparse_samples)
    return [[members, round(slow * 1e3, 2), round(fast * 1e3, 3), f"{slow / fast:.0f}x"]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_embed",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="embeddings timed per length")
    parser.add_argument("--sizes", default="10000,50000", help="namespace sizes searched")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                        help="prompt lengths embedded, in words")
    parser.add_argument("--lookups", type=int, default=400, help="searches per size")
    parser.add_argument("--sparse-members", type=int, default=2000,
                        help="members of the side-by-side run with the sparse index")
    parser.add_argument("--sparse-lookups", type=int, default=20,
                        help="lookups of the side-by-side run")
    parser.add_argument("--cpu", type=int, default=-1,
                        help="bind the process to this CPU (default -1: any one at a time)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
        lengths = [int(length) for length in args.lengths.split(",")]
    except ValueError:
        sizes = lengths = []
    if args.runs < 1 or args.lookups < 2 or not sizes or min(sizes) < 1 or not lengths \
            or min(lengths) < 1:
        print("--runs >= 1, --lookups >= 2, --sizes and --lengths positive integers",
              file=sys.stderr)
        return 2
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    rng = random.Random(args.seed)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    embedding = embedding_rows(lengths, args.runs, rng)
    search = search_rows(sizes, args.lookups, rng)
    compared = side_by_side(args.sparse_members, args.sparse_lookups, rng)
    tables = [
        Table("Embedding one prompt, one core (ms)",
              ["words", "tokens", "local p50", "local p99", "local per text in 8", "hashing p50"],
              embedding,
              "The local model's cost grows with the prompt's tokens (capped at 256); batching "
              "concurrent lookups divides the fixed part of a run among them. The hashing "
              "embedder costs a small fraction of the model."),
        Table(f"Dense search, {DIMENSIONS} dimensions, threshold {THRESHOLD}, one core (ms)",
              ["members", "p50", "p99", "hits", "matrix MiB"], search,
              "One matrix-vector product over the namespace's rows, beyond the embedding."),
        Table("Dense against sparse index, same vectors and queries, one core (ms, median)",
              ["members", "sparse index", "dense index", "ratio"], compared,
              "The inverted index walks every member's 384 postings for a dense query: it is "
              "for the hashing embedder's sparse vectors, not a model's."),
    ]
    for table in tables:
        print(table.title)
        print("  ".join(f"{column:>14}" for column in table.columns))
        for row in table.rows:
            print("  ".join(f"{value!s:>14}" for value in row))
        print()
    if not args.no_record:
        command = "python -m loadtest.bench_embed " + " ".join(argv or sys.argv[1:])
        load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        path = record("bench_embed", title="Semantic cache: embedding and dense search cost",
                      command=command.strip(), tables=tables,
                      notes=f"One-minute load average {load_before:.1f} at the start and"
                            f" {load_after:.1f} at the end, on {os.cpu_count()} CPUs: other"
                            " work on the machine shows in the p99s.")
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
