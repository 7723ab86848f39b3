"""What small-model routing's decision costs a request on one core, measured side by side: the
rules, the classifier's score (hashed: from the text; minilm: from the prompt's embedding, the
numpy row turned into floats as the gateway does), and the MiniLM embedding itself, which the
minilm classifier needs on top.

Every prompt of the labelled set (tests/data/routing_prompts.jsonl) is decided `rounds` times;
each call is timed alone, in the thread's CPU time (what the call costs the core it runs on; on a
shared machine the wall clock also counts the time other processes held the core) and in wall
time; p50/p99/max are over all the calls. The embedding is `MiniLM.encode` of the one prompt on
its one onnxruntime thread (the gateway runs it in a worker thread, batched with concurrent
calls; the hop is not counted here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtest.results import Table
from routing.difficulty.labelled import read_prompts
from routing.difficulty.model import score
from routing.difficulty.weights import shipped
from routing.model_select import Ask, SmallModelRoute, certain

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "routing_prompts.jsonl"
ROUTE = SmallModelRoute(alias="auto", large="large", small="small")


def timed(calls: Sequence[Callable[[], object]], rounds: int
          ) -> tuple[list[float], list[float]]:
    """Each call's CPU time and wall time in ms, `rounds` times over."""
    cpu: list[float] = []
    wall: list[float] = []
    thread, clock = time.thread_time_ns, time.perf_counter_ns
    for _ in range(rounds):
        for call in calls:
            start, began = thread(), clock()
            call()
            cpu.append((thread() - start) / 1e6)
            wall.append((clock() - began) / 1e6)
    return cpu, wall


def quantiles(values: Sequence[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return (ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            ordered[-1])


def measure(rounds: int, embed_rounds: int) -> tuple[list[list[object]], str]:
    """The table's rows (step, calls, CPU p50/p99/max, wall p50/p99, in ms) and the embedder's
    name."""
    texts = [prompt.text for prompt in read_prompts(DATA.read_text(encoding="utf-8"))]
    hashed, minilm = shipped("hashed"), shipped("minilm")
    asks = [Ask(text=text, max_tokens=None, turns=1) for text in texts]
    rows: list[list[object]] = []

    def row(what: str, calls: Sequence[Callable[[], object]], times: int) -> None:
        cpu, wall = timed(calls, times)
        p50, p99, worst = quantiles(cpu)
        wall50, wall99, _ = quantiles(wall)
        rows.append([what, len(cpu), *(round(v, 4) for v in (p50, p99, worst, wall50, wall99))])

    def rules(ask: Ask) -> Callable[[], object]:
        return lambda: certain(ROUTE, ask)

    def by_hashed(ask: Ask) -> Callable[[], object]:
        return lambda: (certain(ROUTE, ask), score(hashed, ask.text))

    row("rules (certain)", [rules(ask) for ask in asks], rounds)
    row("rules + hashed classifier", [by_hashed(ask) for ask in asks], rounds)
    try:
        from gateway.cache.embedders.local import NAME, MiniLM
    except ImportError:
        return rows, "no embedder (kvgate[semantic] not installed)"
    model = MiniLM()
    vectors = {text: model.encode([text])[0] for text in texts}

    def by_minilm(ask: Ask) -> Callable[[], object]:
        vector = vectors[ask.text]
        return lambda: (certain(ROUTE, ask), score(minilm, ask.text, vector.tolist()))

    def embedding(text: str) -> Callable[[], object]:
        return lambda: model.encode([text])

    row("rules + minilm classifier, given the embedding", [by_minilm(ask) for ask in asks],
        rounds)
    row("the MiniLM embedding of the prompt (beside it)", [embedding(t) for t in texts],
        embed_rounds)
    return rows, NAME


def table(rows: Sequence[Sequence[object]], embedder: str) -> Table:
    return Table("The decision's cost per request, one core (ms)",
                 ["step", "calls", "CPU p50", "CPU p99", "CPU max", "wall p50", "wall p99"],
                 rows,
                 f"The classifier's own cost is the rows without the embedding ({embedder}); "
                 "a minilm alias pays the embedding on top, per request no rule decided, "
                 "once: the semantic cache's lookup reads the same embedding.")
