"""Per-request routing cost of the Dispatcher: submit (cost estimate, prefix chain, a TTFT
prediction per candidate, admission, the policy's decision, the lease) plus finish.

    .venv/bin/python -m loadtest.bench_routing [--policy cost] [--candidates 8 32] [-n 20000]

Backends are fresh, half loaded, with distinct load figures; prompts are ~2,000 characters with
a shared system prompt, so the prefix index has matches to look up.
"""

from __future__ import annotations

import argparse
import random
import timeit

from routing.dispatch import Dispatch, DispatchConfig, Dispatcher, Job
from routing.fleet import Fleet
from routing.policy import PolicyContext, build_router
from routing.state import BackendSnapshot, BackendSpec

SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 10


def setup(policy: str, candidates: int) -> tuple[Dispatcher, list[Job]]:
    rng = random.Random(7)
    fleet = Fleet([BackendSpec(f"b{i}", f"http://127.0.0.1:{9000 + i}", ("m",))
                   for i in range(candidates)], max_snapshot_age=1e9)
    for i in range(candidates):
        fleet.record_scrape(f"b{i}", BackendSnapshot(
            taken_at=0.0, format="vllm", kv_total_blocks=20_000,
            kv_free_blocks=rng.randrange(5_000, 15_000), block_size=16,
            running=rng.randrange(0, 64), waiting=rng.randrange(0, 4),
            prefix_cache_hit_rate=0.3))
    router = build_router(policy, PolicyContext(rng=random.Random(1)))
    dispatcher = Dispatcher(fleet, router, config=DispatchConfig(queue_max_depth=1 << 20))
    jobs = [Job(f"r{i}", "m", SYSTEM + f"question {i}: " + "lorem ipsum " * 120,
                max_tokens=rng.choice((None, 256, 1024)), session=f"s{i % 50}")
            for i in range(1000)]
    return dispatcher, jobs


def measure(dispatcher: Dispatcher, jobs: list[Job], n: int) -> float:
    """Seconds per request, best of three runs of `n`."""
    counter = iter(range(1 << 62))

    def one() -> None:
        out = dispatcher.submit(jobs[next(counter) % len(jobs)], 1.0)
        assert isinstance(out, Dispatch)
        dispatcher.finish(out, 1.0)

    return min(timeit.repeat(one, number=n, repeat=3)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="cost")
    parser.add_argument("--candidates", type=int, nargs="+", default=[8, 32])
    parser.add_argument("-n", type=int, default=20_000, help="requests per measurement")
    args = parser.parse_args()
    for count in args.candidates:
        dispatcher, jobs = setup(args.policy, count)
        best = measure(dispatcher, jobs, args.n)
        print(f"{args.policy}: {count} candidates: {best * 1e6:.1f} us per request "
              f"(submit + finish, best of 3 x {args.n})")


if __name__ == "__main__":
    main()
