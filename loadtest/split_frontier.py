"""A what-if diagnostic for the chat workload: `kvgate simulate`
with a fixed share of requests sent to one pool of backends, whatever the policy would choose.

    python -m loadtest.split_frontier --share 0.25 [--pool b4,b5,b6,b7] \\
        [--min-prompt N] [--max-prompt N] \\
        -- simulate --workload chat --policies cost --load 0.85 --duration 120 --seeds 0,1,2,3,4

Each request the split applies to (every one, or those of `--min-prompt` to `--max-prompt`
estimated prompt tokens) is drawn into `--pool` with probability `--share` and into the other
backends otherwise; the policy then chooses within that side, SLO admission and the KV rule
included. When the side drawn has no candidate left, the policy sees them all. What follows `--`
is a `kvgate` command line, or `probe` and the options of `python -m loadtest.probe`. Not a
policy: the share is fixed by hand, per workload and load, which no operator can do; it shows
what an arrangement of the fleet is worth.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
from collections.abc import Callable, Sequence

import loadtest.fleetsim.loop as loop
from gateway.cli import main as kvgate_main
from loadtest.probe import main as probe_main
from routing.policies import PolicyContext, build_router
from routing.policy import Router
from routing.scheduling.cycle import CycleState
from routing.state import Candidate


class PoolSplit:
    """A router filter: the request's side of the fleet, drawn at random with `share` for `pool`."""

    def __init__(self, pool: frozenset[str], share: float, rng: random.Random, *,
                 min_prompt: int = 0, max_prompt: int | None = None) -> None:
        self.pool = pool
        self.share = share
        self.rng = rng
        self.min_prompt = min_prompt
        self.max_prompt = max_prompt

    def filter(self, cycle: CycleState, candidates: list[Candidate]) -> list[Candidate]:
        tokens = cycle.prompt_tokens
        if tokens < self.min_prompt or (self.max_prompt is not None and tokens > self.max_prompt):
            return list(candidates)
        in_pool = self.rng.random() < self.share
        side = [c for c in candidates if (c.id in self.pool) == in_pool]
        return side or list(candidates)


def split_router(pool: frozenset[str], share: float, *, min_prompt: int = 0,
                 max_prompt: int | None = None) -> Callable[[str, PolicyContext], Router]:
    """`build_router` with a PoolSplit ahead of the policy's own filters. Each router's draws are
    seeded from its own random state (kvgate simulate seeds it by run seed, policy and replica),
    without consuming it: the same command gives the same numbers, whatever --jobs."""

    def build(name: str, ctx: PolicyContext) -> Router:
        router = build_router(name, ctx)
        rng = random.Random(repr(ctx.rng.getstate()[1][:8]))
        split = PoolSplit(pool, share, rng, min_prompt=min_prompt, max_prompt=max_prompt)
        return Router(router.name, picker=router.picker, filters=(split, *router.filters),
                      scorers=router.scorers, hooks=router.hooks)

    return build


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in args:
        at = args.index("--")
        args, rest = args[:at], args[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m loadtest.split_frontier",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--share", type=float, required=True,
                        help="probability that a request is drawn into --pool (0..1)")
    parser.add_argument("--pool", default="b4,b5,b6,b7",
                        help="backend ids of one side (kvgate simulate names them b0, b1, ... "
                             "in --backends order; the default is the L40Ss of the default fleet)")
    parser.add_argument("--min-prompt", type=int, default=0,
                        help="split only prompts of at least this many estimated tokens")
    parser.add_argument("--max-prompt", type=int, default=None,
                        help="split only prompts of at most this many estimated tokens")
    opts = parser.parse_args(args)
    if not 0.0 <= opts.share <= 1.0:
        parser.error("--share must be in [0, 1]")
    # --jobs runs in worker processes: they must be forked from this one to see the split
    # (Python 3.14 starts them from a fresh interpreter by default).
    multiprocessing.set_start_method("fork", force=True)
    namespace = vars(loop)
    namespace["build_router"] = split_router(frozenset(opts.pool.split(",")), opts.share,
                                             min_prompt=opts.min_prompt,
                                             max_prompt=opts.max_prompt)
    try:
        if rest[:1] == ["probe"]:
            return probe_main(rest[1:])
        return kvgate_main(rest)
    finally:
        namespace["build_router"] = build_router


if __name__ == "__main__":
    sys.exit(main())
