"""Per-request routing cost of the Dispatcher: submit (cost estimate, prefix chain, the cycle's
facts, admission, the policy's decision, the lease, the learning hooks) plus finish.

    .venv/bin/python -m loadtest.bench_routing [--policy cost] [--candidates 8 64 256]
                                               [--baseline REF] [--rounds 3] [--no-record]

Backends are fresh, half loaded, with distinct load figures; prompts are ~2,000 characters with
a shared system prompt, so the prefix index has matches to look up. The clock stands still and
no reply reports usage, so what the router learned stays as it was: per-backend figures cached
per backend state are reused between decisions as far as the dispatches let them.

With `--baseline REF`, the code at git ref REF is checked out in a temporary worktree and both
codes run the same decisions side by side: each measurement is a fresh subprocess (this file's
worker, importing either tree's `routing`), the two codes alternate round by round, and the best
round of each counts, timed by the worker process's CPU time (the wall clock of a shared machine
also counts the other processes' turns on the core). The backends each picked must be identical,
decision by decision (unless the TTFT model itself changed between the two codes); the
table of microseconds per decision and their ratio is recorded as `results/bench_routing.json`,
and the worktree is removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

SYSTEM = "You are a helpful assistant. Answer briefly and precisely. " * 10
ROOT = Path(__file__).resolve().parent.parent
SIZES = (8, 64, 256)


def _worker(policy: str, candidates: int, n: int) -> dict[str, Any]:
    """One timed run of `n` decisions on whichever tree's `routing` is first on the path."""
    import routing
    from routing.dispatch import Dispatch, DispatchConfig, Dispatcher, Job
    from routing.fleet import Fleet
    from routing.state import BackendSnapshot, BackendSpec

    try:
        from routing.policies import PolicyContext, build_router
    except ImportError:  # an older tree: the registry's entry points lived in routing.policy
        from routing.policy import PolicyContext, build_router  # type: ignore[attr-defined,no-redef]

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
    picks: list[str] = []
    counter = iter(range(1 << 62))

    def one() -> None:
        out = dispatcher.submit(jobs[next(counter) % len(jobs)], 1.0)
        assert isinstance(out, Dispatch)
        picks.append(out.decision.backend_id)
        dispatcher.finish(out, 1.0)

    # The process's CPU time, not the wall clock: on a shared machine the wall clock also counts
    # the time other processes held the core.
    seconds = timeit.Timer(one, timer=time.process_time).timeit(number=n)
    digest = hashlib.sha256("\n".join(picks).encode()).hexdigest()
    return {"us": seconds / n * 1e6, "picks": digest, "first": picks[:8],
            "tree": str(Path(routing.__file__).resolve().parent.parent)}


def _run(tree: Path, policy: str, candidates: int, n: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--policy", policy,
         "--candidates", str(candidates), "-n", str(n)],
        cwd=tree, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["tree"]) != tree.resolve():
        raise RuntimeError(f"the worker for {tree} imported routing from {result['tree']}")
    return result


def decisions(candidates: int) -> int:
    """Decisions per measurement: fewer for larger fleets, each a few seconds at most."""
    return max(200, 40_000 // candidates)


def compare(ref: str, policy: str, sizes: tuple[int, ...], rounds: int, record: bool,
            name: str | None = None) -> int:
    from loadtest.results import Table
    from loadtest.results import record as write_record

    temp = Path(tempfile.mkdtemp(prefix="kvgate-baseline-"))
    tree = temp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree),
                    ref], check=True)
    try:
        best: dict[tuple[str, int], float] = {}
        picks: dict[tuple[str, int], set[str]] = {}
        for r in range(rounds):
            for size in sizes:
                n = decisions(size)
                for label, where in (("baseline", tree), ("current", ROOT)):
                    res = _run(where, policy, size, n)
                    key = (label, size)
                    best[key] = min(best.get(key, float("inf")), res["us"])
                    picks.setdefault(key, set()).add(res["picks"])
                    print(f"round {r + 1}: {size} backends, {label}: {res['us']:.1f} us",
                          file=sys.stderr, flush=True)
        rows: list[list[Any]] = []
        same_all = True
        for size in sizes:
            base, cur = best[("baseline", size)], best[("current", size)]
            same = picks[("baseline", size)] == picks[("current", size)] and len(
                picks[("current", size)]) == 1
            same_all = same_all and same
            rows.append([size, decisions(size), round(base, 1), round(cur, 1),
                         round(cur / base, 3), "identical" if same else "DIFFERENT"])
        columns = ["backends", "decisions", "baseline us", "current us", "ratio", "picks"]
        widths = [max(len(str(x)) for x in col) for col in zip(columns, *rows, strict=True)]
        for line in (columns, *rows):
            print("  ".join(str(x).rjust(w) for x, w in zip(line, widths, strict=True)))
        if record:
            write_record(
                "bench_routing", title="Routing decision cost against a baseline",
                command=f"python -m loadtest.bench_routing --policy {policy} --candidates "
                        f"{' '.join(map(str, sizes))} --baseline "
                        f"{'REF' if name else ref} --rounds {rounds}",
                tables=[Table(
                    f"{policy}: microseconds per decision (submit + finish), best of {rounds}",
                    columns, rows,
                    notes="Both codes in fresh subprocesses, alternating round by round on one "
                          "machine, each timed by its process's CPU time (on a shared machine "
                          "the wall clock counts other processes' turns on the core too); "
                          "'picks' compares the backends chosen, decision by decision. "
                          "The clock stands still and no usage is reported, so per-state caches "
                          "are reused between decisions wherever the dispatches leave a "
                          "backend's state unchanged."
                          + (f" REF, the baseline: {name}." if name else ""))])
        return 0 if same_all else 1
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False)
        shutil.rmtree(temp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--policy", default="cost")
    parser.add_argument("--candidates", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("-n", type=int, default=None, help="decisions per measurement")
    parser.add_argument("--baseline", metavar="REF", help="git ref to compare against")
    parser.add_argument("--baseline-name", metavar="TEXT",
                        help="what the record calls the baseline instead of naming its ref")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (best counts)")
    parser.add_argument("--no-record", action="store_true", help="leave results/ alone")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.policy, args.candidates[0], args.n)))
        return 0
    if args.baseline:
        return compare(args.baseline, args.policy, tuple(args.candidates), args.rounds,
                       not args.no_record, args.baseline_name)
    for count in args.candidates:
        n = args.n or decisions(count)
        best = min(_worker(args.policy, count, n)["us"] for _ in range(args.rounds))
        print(f"{args.policy}: {count} candidates: {best:.1f} us per decision "
              f"(submit + finish, best of {args.rounds} x {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
