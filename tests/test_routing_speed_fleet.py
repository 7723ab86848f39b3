"""Learned speeds in the offline fleet simulation (virtual time): three identical backends under
an even load learn speeds within 15% of each other and split the requests evenly, on every seed."""

from __future__ import annotations

import pytest

from loadtest.fleetsim.backends import parse_fleet
from loadtest.fleetsim.loop import SimConfig, simulate
from loadtest.workloads import schedule, workload

FLEET = parse_fleet("3xllama-3-8b-h100")
DURATION_S = 20.0


@pytest.mark.parametrize("workload_name", ["chat", "mixed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identical_backends_learn_alike_speeds_and_share_the_load(workload_name: str,
                                                                  seed: int) -> None:
    items = schedule(workload(workload_name), rate=20.0, duration_s=DURATION_S, seed=seed)
    out = simulate(items, FLEET, SimConfig(policy="cost", admission=True, seed=seed),
                   duration_s=DURATION_S)
    scales = [b.speed_scale for b in out.backends]
    assert all(s is not None for s in scales), scales
    known = [s for s in scales if s is not None]
    assert max(known) / min(known) <= 1.15, scales
    served = sum(b.requests for b in out.backends)
    shares = [b.requests / served for b in out.backends]
    assert max(shares) <= 0.42 and min(shares) >= 0.25, shares
