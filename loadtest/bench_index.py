"""The semantic index's cost per lookup against a brute-force scan, side by side.

    python -m loadtest.bench_index [--members 256] [--lookups 200] [--seed 1] [--no-record]

Three sets of --members questions, embedded by the built-in hashing embedder: one template with
different subjects (as `loadtest/bench_cache.py` asks), random questions over a 30-word
vocabulary (every pair shares words), and random questions over a 3,000-word vocabulary with
common words mixed in (closest to varied real traffic). Half the lookups are near-duplicates of a
member (hits), half new questions (misses), at the default threshold 0.9. Both methods must find
the same answers; the script says so, or exits 1. The table goes to
`loadtest/results/bench_index.json` (`--no-record`: nowhere).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

from gateway.cache.embed import hashed_vector
from gateway.cache.index import SemanticIndex
from gateway.cache.vectors import Vector, cosine
from loadtest.bench_cache import questions
from loadtest.results import Table, add_arguments, command, save

THRESHOLD = 0.9
STOPWORDS = "what is the of a to how do i in for and can you".split()


def question_sets(members: int, rng: random.Random) -> dict[str, Callable[[int], str]]:
    small = "alpha beta gamma delta river mountain code python java sort list cache token model"
    small_vocabulary = small.split() + "weather paris rome tokyo capital history music".split()
    large_vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                for _ in range(rng.randint(4, 9))) for _ in range(3000)]
    template = questions(120)

    def one_template(i: int) -> str:
        return f"{template[i % len(template)]} (case {i})"

    def small_words(i: int) -> str:
        return " ".join(rng.choice(small_vocabulary) for _ in range(rng.randint(5, 12))) + f" {i}?"

    def large_words(i: int) -> str:
        words = ([rng.choice(large_vocabulary) for _ in range(rng.randint(2, 5))]
                 + [rng.choice(STOPWORDS) for _ in range(rng.randint(3, 6))])
        rng.shuffle(words)
        return " ".join(words) + "?"

    return {"one template": one_template, "30-word vocabulary": small_words,
            "3,000-word vocabulary": large_words}


def brute_force(members: dict[str, Vector], query: Vector) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for id, vector in members.items():
        score = cosine(query, vector)
        if score >= THRESHOLD and (best is None or score > best[1]):
            best = (id, score)
    return best


def timed(find: Callable[[Vector], tuple[str, float] | None], queries: Sequence[Vector]
          ) -> tuple[float, list[tuple[str, float] | None]]:
    started = time.perf_counter()
    found = [find(query) for query in queries]
    return (time.perf_counter() - started) / len(queries), found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_index",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.members < 1 or args.lookups < 2:
        print("--members must be >= 1 and --lookups >= 2", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    print(f"{args.members} members, {args.lookups} lookups (half near-duplicates), threshold "
          f"{THRESHOLD}; µs per lookup")
    print(f"{'set':22} {'brute force':>12} {'index':>8} {'ratio':>6}  hits")
    agree = True
    rows: list[list[object]] = []
    for name, make in question_sets(args.members, rng).items():
        texts = [make(i) for i in range(args.members)]
        members = {f"m{i}": hashed_vector(text) for i, text in enumerate(texts)}
        index = SemanticIndex()
        for rank, (id, vector) in enumerate(members.items()):
            index.add(id, vector, float(rank))
        half = args.lookups // 2
        queries = ([hashed_vector("  " + texts[i % len(texts)].upper() + " ")
                    for i in range(half)]
                   + [hashed_vector(make(args.members + i)) for i in range(args.lookups - half)])
        slow, expected = timed(partial(brute_force, members), queries)
        fast, found = timed(partial(index.best, threshold=THRESHOLD), queries)
        same = all((a is None) == (b is None) and (a is None or b is None or
                                                   abs(a[1] - b[1]) < 1e-9)
                   for a, b in zip(expected, found, strict=True))
        agree = agree and same
        hits = sum(f is not None for f in found)
        print(f"{name:22} {slow * 1e6:12.1f} {fast * 1e6:8.1f} {slow / fast:5.1f}x  {hits}"
              + ("" if same else "  DISAGREE"))
        rows.append([name, round(slow * 1e6, 1), round(fast * 1e6, 1), round(slow / fast, 1),
                     hits, "yes" if same else "NO"])
    if not agree:
        print("FAILED: the index and the scan disagree (nothing recorded)")
        return 1
    save(args, "bench_index", title="Semantic index against a brute-force scan",
         command=command("loadtest.bench_index", sys.argv[1:] if argv is None else argv),
         tables=[Table(f"µs per lookup: {args.members} members, {args.lookups} lookups (half "
                       f"near-duplicates), threshold {THRESHOLD}",
                       ["question set", "brute force", "index", "speed-up", "hits",
                        "same answers"], rows,
                       "Both methods run in the same process one after the other; the speed-up "
                       "is their ratio.")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
