"""The cache benchmark's in-process measurements (loadtest/bench_cache.py): what one lookup
costs, and the semantic tier's search and exact-hit targets.

- `lookup_costs`: microseconds per lookup (exact hit, semantic hit, miss) against a store, with
  the hashing embedder, through `ResponseCache.lookup`.
- `search_costs`: the semantic search beyond the embedding, in one namespace of N entries: the
  dense index the stores keep for a model's vectors (`DenseVectors`, 384 dimensions) and the
  near-miss guard over its candidates (`Vetting`: a cached question is read when it is first
  a candidate), as `MemoryStore.nearest` runs them. The questions come in clusters of
  `CLUSTER` that differ only in a number, their vectors close (cosine about 0.98), so a lookup
  meets what real traffic brings: a third are surface variants of a stored question (a hit,
  often after the guard vetoed a sibling), a third a new member of a cluster (every candidate
  vetoed: the guard's worst case), a third unrelated (no candidate). The vectors are random
  (the model's own cost is `embedding_costs`): the matrix product costs the same for any.
- `embedding_costs`: the local model's cost per prompt of 8, 50 and 200 words, one at a time.
- `exact_costs`: an exact hit over a `RedisStore` on loopback, made as the gateway makes it:
  the request's key, `ResponseCache.lookup` and the replayed JSON body, and the lookup alone.

Each timing is read twice: wall time, and the thread's CPU time (what the code costs, whatever
else the machine runs).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import numpy as np

from gateway.cache.answer import CachedAnswer, render_json
from gateway.cache.cache import ResponseCache
from gateway.cache.embed import HashingEmbedder
from gateway.cache.keys import CacheKey
from gateway.cache.redis_store import RedisStore
from gateway.cache.semantic import Vetting
from gateway.cache.setup import build_store
from gateway.cache.store import CacheStore, Entry, MemoryStore
from gateway.cache.vector_index import index_maker
from gateway.config import CacheSettings
from loadtest.redis_server import running_redis
from loadtest.results import Table

DIMENSIONS = 384
THRESHOLD = 0.85  # the local model's
CLUSTER = 10
EMBED_WORDS = (8, 50, 200)
WORDS = ("cache model token answer question server memory route python list sort river "
         "mountain history music weather capital network latency budget account password "
         "reset change file folder queue thread socket").split()
SUBJECTS = ("France", "Spain", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Egypt", "Chile",
            "India", "Peru", "Italy", "Greece", "Mexico", "Vietnam", "Ghana", "Poland", "Nepal")
TEMPLATES = ("What is the capital of {}?", "What language do people speak in {}?",
             "What is the currency of {}?", "What is a traditional dish from {}?",
             "When did {} become independent?", "What is the population of {}?")


def percentile(samples: Sequence[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summary(wall: Sequence[float], cpu: Sequence[float]) -> dict[str, float]:
    """Milliseconds: p50 and p99 of the wall and CPU times (given in seconds)."""
    return {"p50_ms": round(percentile(wall, 0.5) * 1e3, 3),
            "p99_ms": round(percentile(wall, 0.99) * 1e3, 3),
            "cpu_p50_ms": round(percentile(cpu, 0.5) * 1e3, 3),
            "cpu_p99_ms": round(percentile(cpu, 0.99) * 1e3, 3)}


def timed(call: Callable[[], Any], wall: list[float], cpu: list[float]) -> Any:
    started, started_cpu = time.perf_counter(), time.thread_time()
    found = call()
    cpu.append(time.thread_time() - started_cpu)
    wall.append(time.perf_counter() - started)
    return found


def _question(cluster: int, member: int) -> str:
    base = TEMPLATES[cluster % len(TEMPLATES)].format(SUBJECTS[cluster // len(TEMPLATES)
                                                               % len(SUBJECTS)])
    return f"{base} Answer for the year {1000 + cluster // 108}, part {member + 1}."


def _unit(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    found: np.ndarray[Any, Any] = (rows / np.linalg.norm(rows, axis=-1, keepdims=True)
                                   ).astype(np.float32)
    return found


def _vector(row: np.ndarray[Any, Any]) -> dict[int, float]:
    """A dense row in the cache's `Vector` shape, as the embedder hands it over."""
    return dict(enumerate(row.tolist()))


def search_costs(size: int, lookups: int, seed: int = 0) -> dict[str, Any]:
    """p50/p99 of one semantic search among `size` entries of one namespace, by probe kind and
    overall, and how many probes found what they should (a hit for a variant, none else)."""
    generator = np.random.default_rng(seed)
    clusters = max(1, size // CLUSTER)
    bases = _unit(generator.normal(size=(clusters, DIMENSIONS)))
    index = index_maker(DIMENSIONS, dense=True, max_members=size)()
    vetting = Vetting()
    entries: dict[str, Entry] = {}
    rows = np.empty((size, DIMENSIONS), dtype=np.float32)
    for number in range(size):
        cluster, member = divmod(number, CLUSTER)
        noise = generator.normal(size=DIMENSIONS) / np.sqrt(DIMENSIONS) * 0.2
        rows[number] = _unit(bases[cluster % clusters] + noise)
        entry = Entry(id=f"e{number}", namespace="bench", vector=None, answer=b"",
                      model="m", query=_question(cluster, member), created=float(number))
        entries[entry.id] = entry
        index.add(entry.id, _vector(rows[number]), entry.created)
    probes: list[tuple[str, str, dict[int, float], str | None]] = []
    for number in range(lookups):
        kind = ("variant", "near miss", "unrelated")[number % 3]
        target = int(generator.integers(0, size))
        cluster = target // CLUSTER
        noise = generator.normal(size=DIMENSIONS) / np.sqrt(DIMENSIONS) * 0.1
        if kind == "variant":
            text = "  " + entries[f"e{target}"].query.lower().rstrip(".") + " "
            row, expected = _unit(rows[target] + noise), f"e{target}"
        elif kind == "near miss":
            text, row, expected = _question(cluster, CLUSTER), _unit(bases[cluster] + noise), None
        else:
            text = " ".join(random.Random(number).choices(WORDS, k=12)) + "?"
            row, expected = _unit(generator.normal(size=DIMENSIONS)), None
        probes.append((kind, text, _vector(row), expected))
    by_kind: dict[str, tuple[list[float], list[float]]] = {}
    right = 0
    for kind, text, vector, expected in probes:
        wall, cpu = by_kind.setdefault(kind, ([], []))
        found = timed(partial(_nearest, index, entries, vetting, text, vector), wall, cpu)
        right += (found[0] if found else None) == expected
    every_wall = [s for wall, _ in by_kind.values() for s in wall]
    every_cpu = [s for _, cpu in by_kind.values() for s in cpu]
    return {"size": size, "lookups": lookups, "right": right,
            "all": summary(every_wall, every_cpu),
            **{kind: summary(wall, cpu) for kind, (wall, cpu) in by_kind.items()}}


def _nearest(index: Any, entries: dict[str, Entry], vetting: Vetting, text: str,
             vector: dict[int, float]) -> tuple[str, float] | None:
    """`MemoryStore.nearest`'s search: the best member the guard admits."""
    admits = vetting.admits_for(text)
    found: tuple[str, float] | None = index.best(
        vector, THRESHOLD, skip=lambda id: not admits(entries[id]))
    return found


def embedding_costs(lengths: Sequence[int], runs: int, seed: int = 0) -> list[dict[str, Any]]:
    """The local model's p50/p99 per prompt length in words, one text at a time (what a lookup
    pays when no other lookup shares its batch)."""
    from gateway.cache.embedders.local import MiniLM

    rng = random.Random(seed)
    model = MiniLM()
    found = []
    for length in lengths:
        text = " ".join(rng.choice(WORDS) for _ in range(length)) + "?"
        model.encode([text])  # warm
        wall: list[float] = []
        cpu: list[float] = []
        for _ in range(runs):
            timed(partial(model.encode, [text]), wall, cpu)
        found.append({"words": length, "tokens": model.token_counts([text])[0],
                      **summary(wall, cpu)})
    return found


async def exact_costs(entries: int, lookups: int) -> dict[str, Any]:
    """p50/p99 of an exact hit over a loopback redis-server of our own, the store made as the
    gateway makes it (gateway/cache/setup.py): the whole path (the request's key, the lookup,
    the replayed body) and the lookup alone."""
    answer = CachedAnswer("chat", "m", "text " * 40, "stop", 20, 40).to_bytes()
    bodies = [{"model": "m", "temperature": 0, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": TEMPLATES[i % len(TEMPLATES)].format(f"country {i}")}]}
        for i in range(entries)]
    async with running_redis() as url:
        settings = CacheSettings(enabled=True, store="redis", redis_url=url, ttl_s=None,
                                 timeout_s=5.0)
        cache = ResponseCache(build_store(settings), None, threshold=0.9,
                              timeout_s=settings.timeout_s)
        keys = [cache.key("chat", body, "m") for body in bodies]
        for key in keys:
            assert isinstance(key, CacheKey)
            await cache.store.put(Entry(id=key.id, namespace=f"exact/{key.namespace}",
                                        vector=None, answer=answer, model="m",
                                        query=key.query or "", created=time.time()))
        wall: list[float] = []
        cpu: list[float] = []
        lookup_wall: list[float] = []
        lookup_cpu: list[float] = []
        for number in range(lookups + 20):
            started, started_cpu = time.perf_counter(), time.thread_time()
            key = cache.key("chat", bodies[number % entries], "m")
            assert isinstance(key, CacheKey)
            looked, looked_cpu = time.perf_counter(), time.thread_time()
            found = await cache.lookup(key)
            found_at, found_cpu = time.perf_counter(), time.thread_time()
            if found.hit is None or found.hit.tier != "exact":
                raise AssertionError(f"an exact probe gave {found.hit}")
            render_json(found.hit.answer, response_id="chatcmpl-bench", created=int(time.time()))
            if number >= 20:  # the first ones open the connections
                cpu.append(time.thread_time() - started_cpu)
                wall.append(time.perf_counter() - started)
                lookup_cpu.append(found_cpu - looked_cpu)
                lookup_wall.append(found_at - looked)
        await cache.close()
    return {"entries": entries, "lookups": lookups, **summary(wall, cpu),
            "lookup": summary(lookup_wall, lookup_cpu)}


async def lookup_costs(store_name: str, entries: int, rounds: int = 500) -> dict[str, float]:
    """Microseconds per lookup, by result, against a store of `entries` answers in 8
    namespaces (so a semantic lookup compares up to `max_per_namespace` of them)."""
    embedder = HashingEmbedder()
    pool = [template.format(subject) for template in TEMPLATES for subject in SUBJECTS]
    answer = CachedAnswer("chat", "m", "text " * 40, "stop", 20, 40).to_bytes()
    keys = [_key(f"{pool[i % len(pool)]} (case {i})", namespace=f"ns{i % 8}")
            for i in range(entries)]
    async with _store(store_name, entries) as store:
        cache = ResponseCache(store, embedder, threshold=0.9, timeout_s=5.0)
        for key in keys:
            vector = await cache.embedding(key)
            await store.put(Entry(id=key.id, namespace=f"{embedder.name}/{key.namespace}",
                                  vector=vector, answer=answer, model="m",
                                  query=key.query or "", created=time.time()))
        probes: dict[str, tuple[str | None, list[CacheKey]]] = {
            "exact hit": ("exact", keys[:rounds]),
            "semantic hit": ("semantic", [
                _key(f"  {k.query.lower()} ", namespace=k.namespace, fresh=True)
                for k in keys[:rounds] if k.query]),
            "miss": (None, [_key(f"How tall is mountain number {i}?", namespace="ns1",
                                 fresh=True) for i in range(rounds)]),
        }
        costs: dict[str, float] = {}
        for name, (tier, probe_keys) in probes.items():
            started = time.perf_counter()
            for key in probe_keys:
                found = await cache.lookup(key)
                if (found.hit.tier if found.hit else None) != tier:
                    raise AssertionError(f"{store_name}: a {name} probe gave {found.hit}")
            costs[name] = round((time.perf_counter() - started) / len(probe_keys) * 1e6, 1)
        await cache.close()
    return costs


def _key(query: str, *, namespace: str, fresh: bool = False) -> CacheKey:
    """A key whose id is its text (a `fresh` one has no exact entry)."""
    return CacheKey(id=f"{'fresh:' if fresh else ''}{namespace}:{query}", namespace=namespace,
                    query=query, model="m", kind="chat", deterministic=True)


@asynccontextmanager
async def _store(name: str, entries: int) -> AsyncIterator[CacheStore]:
    if name == "memory":
        yield MemoryStore(max_entries=entries * 2, ttl_s=None)
        return
    async with running_redis() as url:
        yield RedisStore.from_url(url, ttl_s=None)


SEARCH_TARGET_MS = {10_000: 2.0, 50_000: 10.0}  # p99, by namespace size; others: none
EXACT_TARGET_MS = 1.0
CPU_TARGET_RATIO = 1.3


def pin_to_one_core() -> int | None:
    """Binds this process to one CPU (the last it may use) and returns it; None where the
    system cannot."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


async def measure_targets(args: argparse.Namespace) -> tuple[dict[str, Any], list[Table]]:
    """Every target's figures (`args`: search_sizes, search_lookups, embed_runs,
    exact_lookups, cpu_rounds, cpu_requests, time_scale), and their tables."""
    from loadtest.cache_cpu import cpu_per_request

    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    core = pin_to_one_core()
    others = {cpu for cpu in allowed if cpu != core}
    gateway_cpus = {min(others)} if others else set()
    found: dict[str, Any] = {"core": core, "load_before": os.getloadavg()[0]}
    found["search"] = [search_costs(size, args.search_lookups, args.seed)
                       for size in args.search_sizes]
    found["embedding"] = embedding_costs(EMBED_WORDS, args.embed_runs, args.seed)
    found["exact"] = await exact_costs(1000, args.exact_lookups)
    found["cpu"] = await cpu_per_request(
        rounds=args.cpu_rounds, requests=args.cpu_requests, concurrency=4,
        time_scale=args.time_scale * 50, cpus=gateway_cpus)
    found["load_after"] = os.getloadavg()[0]
    rows: list[list[Any]] = []
    for search in found["search"]:
        limit = SEARCH_TARGET_MS.get(search["size"])
        rows.append([f"semantic search p99, {search['size']:,} entries (ms)",
                     search["all"]["p99_ms"], search["all"]["cpu_p99_ms"], limit,
                     _met(search["all"]["p99_ms"], limit), _met(search["all"]["cpu_p99_ms"],
                                                                limit)])
    exact = found["exact"]
    rows.append(["exact hit p99, loopback Redis: key, lookup, body (ms)", exact["p99_ms"],
                 exact["cpu_p99_ms"], EXACT_TARGET_MS, _met(exact["p99_ms"], EXACT_TARGET_MS),
                 _met(exact["cpu_p99_ms"], EXACT_TARGET_MS)])
    rows.append(["exact hit p99, the lookup alone (ms)", exact["lookup"]["p99_ms"],
                 exact["lookup"]["cpu_p99_ms"], None, "-", "-"])
    cpu = found["cpu"]
    rows.append(["gateway CPU per miss, semantic on / off (hashing)", cpu["ratio"],
                 cpu["ratio"], CPU_TARGET_RATIO, _met(cpu["ratio"], CPU_TARGET_RATIO),
                 _met(cpu["ratio"], CPU_TARGET_RATIO)])
    tables = [
        Table("Targets, one core", ["target", "measured (wall)", "measured (CPU)", "limit",
                                    "met (wall)", "met (CPU)"], rows,
              "Wall is what a request waits; CPU is the thread's own time, what the code costs "
              "whatever else the machine runs. The CPU row is one figure, read from /proc. "
              f"One-minute load average {found['load_before']:.1f} at the start and "
              f"{found['load_after']:.1f} at the end, on {os.cpu_count()} CPUs."),
        Table("Semantic search beyond the embedding, by probe (ms)",
              ["entries", "probe", "p50", "p99", "CPU p50", "CPU p99"],
              [[search["size"], kind, *search[kind].values()] for search in found["search"]
               for kind in ("variant", "near miss", "unrelated", "all")],
              "A variant is a stored question reworded (a hit); a near miss a new member of a "
              f"cluster of {CLUSTER} alike questions (every candidate vetoed by the guard); "
              "unrelated, no candidate."),
        Table("Embedding one prompt with the local model, one core (ms)",
              ["words", "tokens", "p50", "p99", "CPU p50", "CPU p99"],
              [list(row.values()) for row in found["embedding"]]),
        Table("Gateway CPU per request on a miss (µs), its own process, rounds interleaved",
              ["semantic on", "semantic off", "ratio (median)", "ratio min", "ratio max",
               "rounds", "requests a round"],
              [[cpu["on_us"], cpu["off_us"], cpu["ratio"], cpu["ratio_min"], cpu["ratio_max"],
                cpu["rounds"], cpu["requests"]]]),
    ]
    return found, tables


def _met(value: float, limit: float | None) -> str:
    return "-" if limit is None else ("yes" if value <= limit else "no")
