"""The live cache-aware comparison's arithmetic: shares compared sorted (which backend a group
lands on first is a tie-break), the largest gap rank by rank, and a group's stickiness."""

from __future__ import annotations

import pytest

from loadtest.bench_cache_aware_live import affinity, requests, share_gap, sorted_shares


def test_shares_are_compared_largest_first_whatever_the_backend() -> None:
    assert sorted_shares([0, 0, 30, 10]) == [0.75, 0.25, 0.0, 0.0]
    assert share_gap(sorted_shares([30, 10, 0, 0]), sorted_shares([0, 10, 0, 30])) == 0.0
    assert share_gap([0.5, 0.3, 0.2], [0.4, 0.4, 0.2]) == pytest.approx(0.1)
    assert sorted_shares([0, 0]) == []


def test_affinity_counts_the_backends_a_group_used_and_its_top_share() -> None:
    placed = [(0, 1), (0, 1), (0, 2), (1, 3), (1, 3)]
    spread, top = affinity(placed)
    assert spread == 1.5  # group 0 on two backends, group 1 on one
    assert top == pytest.approx(4 / 5)
    assert affinity([]) == (0.0, 0.0)


def test_the_requests_share_one_of_a_few_system_prompts_zipf_weighted() -> None:
    plan = requests(groups=8, count=400, seed=0, max_tokens=4)
    assert plan == requests(groups=8, count=400, seed=0, max_tokens=4)
    counts = [sum(r.group == g for r in plan) for g in range(8)]
    assert counts[0] > counts[3] > 0 and sum(counts) == 400
    systems = {r.group: r.body["messages"][0]["content"] for r in plan}  # type: ignore[index]
    assert len(set(systems.values())) == 8
    assert all(1200 < len(text) < 2000 for text in systems.values())
