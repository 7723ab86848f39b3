"""The split-frontier diagnostic: a fixed, size-blind share of requests goes to one pool."""

from __future__ import annotations

import json
import random
from pathlib import Path

import loadtest.fleetsim.loop as loop
from loadtest.split_frontier import PoolSplit, main
from routing.policies import build_router
from routing.scheduling.cycle import CycleState
from routing.state import BackendSpec, Candidate
from tests.test_routing_scorers import cost

POOL = frozenset({"slow1", "slow2"})


def cand(backend_id: str) -> Candidate:
    return Candidate(spec=BackendSpec(id=backend_id, url=f"http://127.0.0.1/{backend_id}",
                                      models=("m",)),
                     healthy=True, snapshot=None, stale=True, inflight=0, reserved_blocks=0)


FLEET = [cand("fast1"), cand("fast2"), cand("slow1"), cand("slow2")]


def request(prompt_tokens: int = 1) -> CycleState:
    return CycleState("m", cost(prompt=prompt_tokens))


def sides(split: PoolSplit, prompt_tokens: int, n: int = 2000) -> list[bool]:
    """For each of n requests: True when it was given the pool's side only."""
    out = []
    for _ in range(n):
        kept = {c.id for c in split.filter(request(prompt_tokens), FLEET)}
        assert kept in ({"slow1", "slow2"}, {"fast1", "fast2"}, {c.id for c in FLEET})
        out.append(kept == POOL)
    return out


def test_a_share_of_requests_whatever_their_size_is_drawn_into_the_pool() -> None:
    split = PoolSplit(POOL, 0.25, random.Random(1))
    for size in (10, 10_000):
        share = sum(sides(split, size)) / 2000
        assert 0.2 < share < 0.3, share


def test_prompts_outside_min_prompt_to_max_prompt_are_not_split() -> None:
    split = PoolSplit(POOL, 0.5, random.Random(1), min_prompt=100, max_prompt=1024)
    for outside in (99, 1025):
        full = {c.id for c in split.filter(request(outside), FLEET)}
        assert full == {c.id for c in FLEET}
    assert any(sides(split, 100, 50)) and any(sides(split, 1024, 50))


def test_when_the_side_drawn_is_empty_the_policy_sees_every_candidate() -> None:
    split = PoolSplit(POOL, 1.0, random.Random(1))
    fast_only = [c for c in FLEET if c.id not in POOL]
    assert split.filter(request(), fast_only) == fast_only


def test_the_same_command_gives_the_same_numbers(tmp_path: Path) -> None:
    def run(name: str, jobs: str) -> object:
        out = tmp_path / name
        assert main(["--share", "0.3", "--", "simulate", "--workload", "chat", "--policies",
                     "cost,least_request", "--rate", "40", "--duration", "5", "--seeds", "0,1",
                     "--jobs", jobs, "--quiet", "--json", str(out)]) == 0
        data = json.loads(out.read_text())
        return [p["policies"] for p in data["points"]]

    assert run("a.json", "1") == run("b.json", "2")
    assert loop.build_router is build_router  # restored: later runs in this process are plain
