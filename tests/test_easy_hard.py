"""The easy/hard workload: labelled prompts with the alias's decision on each, and, replayed in
virtual time, what routing them through the alias does beside sending everything large."""

from __future__ import annotations

import statistics

import pytest

from loadtest.easy_hard import compare, labelled_prompts
from loadtest.fleetsim.backends import parse_fleet
from loadtest.workloads import WORKLOADS, schedule, workload

LARGE, SMALL = parse_fleet("1xllama-3-8b-l40s"), parse_fleet("1xllama-3.2-1b-l40s")


def test_it_is_a_workload_of_the_simulator() -> None:
    assert "easy-hard" in WORKLOADS
    items = schedule(workload("easy-hard"), rate=10.0, duration_s=30.0, seed=0)
    kinds = {item.kind for item in items}
    assert {"easy-small", "hard-large"} <= kinds <= {"easy-small", "easy-large", "hard-small",
                                                     "hard-large"}
    easy = [item.output_tokens for item in items if item.kind.startswith("easy")]
    hard = [item.output_tokens for item in items if item.kind.startswith("hard")]
    assert statistics.median(hard) > 4 * statistics.median(easy)


def test_the_alias_sends_few_hard_prompts_and_most_easy_ones_small() -> None:
    prompts = labelled_prompts()
    hard = [p for p in prompts if p.hard]
    easy = [p for p in prompts if not p.hard]
    assert sum(p.small for p in hard) <= 0.05 * len(hard)
    assert sum(p.small for p in easy) >= 0.5 * len(easy)


@pytest.mark.parametrize("seed", [0, 1])
def test_routing_raises_goodput_over_everything_large_when_the_large_pool_is_full(
        seed: int) -> None:
    everything, routed = compare(LARGE, SMALL, rate=20.0, duration_s=60.0, seed=seed)
    assert everything.small_share == 0.0 and everything.hard_small == 0
    assert routed.small_share > 0.3
    assert routed.hard_small <= 0.05 * routed.hard
    assert routed.goodput_rps > 1.2 * everything.goodput_rps
